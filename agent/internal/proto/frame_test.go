package proto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var stream []byte
	stream = Append(stream, Start, 7, []byte(`{"command":"true"}`))
	stream = Append(stream, Input, 7, nil)
	r := NewReader(bytes.NewReader(stream))
	first, err := r.Read()
	if err != nil || first.Kind != Start || first.Channel != 7 || string(first.Payload) != `{"command":"true"}` {
		t.Fatalf("first %+v %v", first, err)
	}
	second, err := r.Read()
	if err != nil || second.Kind != Input || len(second.Payload) != 0 {
		t.Fatalf("second %+v %v", second, err)
	}
	if _, err := r.Read(); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
}

func TestBadFrames(t *testing.T) {
	for name, stream := range map[string][]byte{
		"short length": {0, 0, 0, 2, 'S', 0, 0},
		"oversized":    {0x7f, 0xff, 0xff, 0xff, 'S', 0, 0, 0, 1},
		"cut payload":  append(Encode(Input, 1, []byte("hello"))[:11], 0),
		"cut header":   {0, 0, 0},
	} {
		if _, err := NewReader(bytes.NewReader(stream)).Read(); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
