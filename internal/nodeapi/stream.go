package nodeapi

import (
	"io"

	"connectrpc.com/connect"
)

// dataMessage is a client-stream message (a pointer to T) that carries bytes.
type dataMessage[T any] interface {
	*T
	GetData() []byte
}

// pipeData feeds the bytes of a client stream's messages, the current (first) one's included,
// into the returned reader until the stream ends, whose error (nil at its end) the reader then
// returns. Closing the reader stops the feeding goroutine at its next write; it then leaves the
// rest of the stream unread, which ends with its handler.
func pipeData[T any, M dataMessage[T]](stream *connect.ClientStream[T]) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		if d := M(stream.Msg()).GetData(); len(d) > 0 {
			if _, err := pw.Write(d); err != nil {
				return
			}
		}
		for stream.Receive() {
			if _, err := pw.Write(M(stream.Msg()).GetData()); err != nil {
				return
			}
		}
		pw.CloseWithError(stream.Err())
	}()
	return pr
}
