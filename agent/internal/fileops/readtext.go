package fileops

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"unicode/utf8"
)

// utf8Chars counts the characters of b decoded as UTF-8 with invalid bytes as U+FFFD,
// continuing from the undecoded tail of the previous piece (carried in, returned out).
func utf8Chars(carry, b []byte, final bool) (int, []byte) {
	data := append(carry, b...)
	count := 0
	for len(data) > 0 {
		if !final && !utf8.FullRune(data) {
			break // may finish in the next piece
		}
		_, size := utf8.DecodeRune(data)
		data = data[size:]
		count++
	}
	return count, append([]byte(nil), data...)
}

// pageLine is one line of a page: its whole length in characters and its first bytes.
type pageLine struct {
	chars int
	kept  []byte
}

// pager follows a file's lines as it is scanned and keeps those of one page
// (lines first..last, 1-based), each cut to its first keep bytes.
type pager struct {
	first, last int64
	keep        int
	lineNo      int64 // the line being scanned
	lines       []pageLine
	current     []byte // the kept start of the line being scanned
	carry       []byte // an undecoded UTF-8 tail, finished by the next piece
	chars       int
	endsCR      bool
}

func (p *pager) inPage() bool { return p.first <= p.lineNo && p.lineNo <= p.last }

// feed takes the next block of the file.
func (p *pager) feed(data []byte) {
	start := 0
	for {
		end := bytes.IndexByte(data[start:], '\n')
		if end < 0 {
			p.add(data[start:])
			return
		}
		p.add(data[start : start+end])
		p.endLine()
		start += end + 1
	}
}

// add takes a piece of the current line (no newline in it).
func (p *pager) add(piece []byte) {
	if !p.inPage() {
		return
	}
	if len(p.current) < p.keep {
		room := p.keep - len(p.current)
		if room > len(piece) {
			room = len(piece)
		}
		p.current = append(p.current, piece[:room]...)
	}
	var c int
	c, p.carry = utf8Chars(p.carry, piece, false)
	p.chars += c
	if len(piece) > 0 {
		p.endsCR = piece[len(piece)-1] == '\r'
	}
}

// endLine ends the current line at its newline.
func (p *pager) endLine() {
	if p.inPage() {
		c, _ := utf8Chars(p.carry, nil, true)
		p.chars += c
		p.carry = nil
		if p.endsCR {
			p.chars-- // a CR before the newline is a line ending, not shown and not counted
		}
		p.lines = append(p.lines, pageLine{chars: p.chars, kept: p.current})
		p.current, p.chars, p.endsCR = nil, 0, false
	}
	p.lineNo++
}

// finish ends a last line that has no newline and returns the file's line count.
func (p *pager) finish(size int64, lastByte byte) int64 {
	total := p.lineNo - 1
	if size > 0 && lastByte != '\n' {
		total++
		if p.inPage() {
			c, _ := utf8Chars(p.carry, nil, true)
			p.lines = append(p.lines, pageLine{chars: p.chars + c, kept: p.current})
		}
	}
	return total
}

// opReadText scans a file once: counts its lines, looks for NUL, keeps the lines of one page.
func opReadText(req ReadTextRequest, o *out) (ReadTextResult, error) {
	path := req.Path
	f, info, err := openRegular(path)
	if err != nil {
		return ReadTextResult{}, err
	}
	defer f.Close()
	first := int64(req.Offset)
	p := &pager{first: first, last: first + int64(req.Limit) - 1, keep: int(req.KeepBytes), lineNo: 1}
	var size int64
	var lastByte byte
	remaining := readLimit(info, procFileCap)
	// No bigger than the file: a fresh buffer is zeroed, and every page of it zeroed is a
	// fault under gVisor (a megabyte cost a millisecond or more).
	bufSize := int64(1 << 20)
	if remaining < bufSize {
		bufSize = remaining
	}
	buf := make([]byte, bufSize)
	for remaining > 0 {
		want := int64(len(buf))
		if want > remaining {
			want = remaining
		}
		n, err := f.Read(buf[:want])
		if n == 0 && err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return ReadTextResult{}, fromOS(err, path)
		}
		data := buf[:n]
		remaining -= int64(n)
		size += int64(n)
		lastByte = data[n-1]
		if bytes.IndexByte(data, 0) >= 0 {
			return ReadTextResult{}, opErr("binary", "%s contains NUL bytes", path)
		}
		p.feed(data)
	}
	total := p.finish(size, lastByte)
	for _, l := range p.lines {
		record := make([]byte, 8+len(l.kept))
		binary.BigEndian.PutUint64(record, uint64(l.chars))
		copy(record[8:], l.kept)
		o.send('L', record)
	}
	return ReadTextResult{TotalLines: total, Size: size}, nil
}
