// Package proto is the agent's side of the daemon <-> agent frame protocol
// (see PROTOCOL.md): framing, the frame kinds, and the JSON payloads.
package proto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version this agent speaks.
const Version = 1

// HeaderSize is the length prefix, the kind and the channel.
const HeaderSize = 4 + 1 + 4

// MaxPayload is the largest payload either side may send.
const MaxPayload = 1 << 20

// Kinds sent by the daemon.
const (
	Hello      byte = 'H'
	Start      byte = 'S'
	Input      byte = 'I'
	CloseInput byte = 'C'
	Signal     byte = 'G'
	Kill       byte = 'K'
	Window     byte = 'W'
	Pull       byte = 'P'
	Discard    byte = 'D'
	FileOp     byte = 'F'
	FileData   byte = 'B'
	FileEnd    byte = 'E'
	FileAck    byte = 'A'
	Freeze     byte = 'Z'
	Rename     byte = 'R'
	Connect    byte = 'N'
)

// Kinds sent by the agent.
const (
	Welcome   byte = 'w'
	Started   byte = 's'
	Failed    byte = 'f'
	Output    byte = 'o'
	Dropped   byte = 'd'
	Tail      byte = 't'
	Exited    byte = 'x'
	FileOut   byte = 'b'
	FileTook  byte = 'k'
	Result    byte = 'r'
	ErrorMsg  byte = 'e'
	Frozen    byte = 'z'
	Connected byte = 'n'
	HungUp    byte = 'h'
)

// Frame is one frame of either direction.
type Frame struct {
	Kind    byte
	Channel uint32
	Payload []byte
}

// ErrFrame is wrapped by every framing error: the stream cannot be read any further.
var ErrFrame = errors.New("bad frame")

// Reader reads frames from a byte stream.
type Reader struct {
	r   *bufio.Reader
	hdr [HeaderSize]byte
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64*1024)}
}

// Read returns the next frame, io.EOF at a clean end of the stream, or an error
// wrapping ErrFrame when the stream is not a frame sequence (a length too short or
// too long, a stream cut mid-frame).
func (fr *Reader) Read() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return Frame{}, io.EOF
		}
		return Frame{}, fmt.Errorf("%w: header: %v", ErrFrame, err)
	}
	length := binary.BigEndian.Uint32(fr.hdr[0:4])
	if length < HeaderSize-4 || length-(HeaderSize-4) > MaxPayload {
		return Frame{}, fmt.Errorf("%w: length %d", ErrFrame, length)
	}
	f := Frame{Kind: fr.hdr[4], Channel: binary.BigEndian.Uint32(fr.hdr[5:9])}
	f.Payload = make([]byte, length-(HeaderSize-4))
	if _, err := io.ReadFull(fr.r, f.Payload); err != nil {
		return Frame{}, fmt.Errorf("%w: payload of %d bytes: %v", ErrFrame, len(f.Payload), err)
	}
	return f, nil
}

// Append encodes a frame onto b.
func Append(b []byte, kind byte, channel uint32, payload []byte) []byte {
	var hdr [HeaderSize]byte
	binary.BigEndian.PutUint32(hdr[0:4], uint32(HeaderSize-4+len(payload)))
	hdr[4] = kind
	binary.BigEndian.PutUint32(hdr[5:9], channel)
	b = append(b, hdr[:]...)
	return append(b, payload...)
}

// InPlace fills in the header of a frame built in place: frame[:HeaderSize] is left for it
// and the payload follows (one copy fewer than Encode for large payloads).
func InPlace(frame []byte, kind byte, channel uint32) []byte {
	binary.BigEndian.PutUint32(frame[0:4], uint32(len(frame)-4))
	frame[4] = kind
	binary.BigEndian.PutUint32(frame[5:9], channel)
	return frame
}

// Encode returns one encoded frame.
func Encode(kind byte, channel uint32, payload []byte) []byte {
	return Append(make([]byte, 0, HeaderSize+len(payload)), kind, channel, payload)
}
