package ingress

import (
	"encoding/binary"
	"net/http/httptest"
	"testing"
)

type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++ }

func envelope(flags byte, payload string) []byte {
	b := make([]byte, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	copy(b[5:], payload)
	return b
}

func TestEndStreamFlushHeldBack(t *testing.T) {
	msg := envelope(0, `{"event":{"start":{"pid":1}}}`)
	end := envelope(connectEndStreamFlag, `{}`)
	empty := envelope(0, ``)
	for _, tc := range []struct {
		name   string
		writes [][]byte
		// want[i]: whether the flush after write i reaches the client
		want []bool
	}{
		{"message then end", [][]byte{msg, end}, []bool{true, false}},
		{"both in one write", [][]byte{append(append([]byte{}, msg...), end...)}, []bool{false}},
		{"end split across writes", [][]byte{msg, end[:3], end[3:6], end[6:]}, []bool{true, true, true, false}},
		{"empty message is not an end", [][]byte{empty, msg}, []bool{true, true}},
		{"message after end resumes flushing", [][]byte{end, msg}, []bool{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			w := &endStreamWriter{ResponseWriter: fc}
			for i, b := range tc.writes {
				before := fc.flushes
				if _, err := w.Write(b); err != nil {
					t.Fatal(err)
				}
				w.Flush()
				if got := fc.flushes > before; got != tc.want[i] {
					t.Fatalf("write %d: flushed %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}
