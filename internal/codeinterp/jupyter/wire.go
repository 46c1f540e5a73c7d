// Package jupyter runs Jupyter kernels (ipykernel, IRkernel, any kernel that speaks the Jupyter
// messaging protocol 5.x) and talks to them over ZeroMQ: it starts the kernel process with a
// connection file, signs and checks every message with the session key (HMAC-SHA256), executes
// code and reports what the kernel publishes while it runs.
//
// It owns the kernel processes it starts and their sockets; it knows nothing about HTTP or about
// E2B's wire format (package codeinterp translates).
package jupyter

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// protocolVersion is the messaging protocol version this client speaks.
const protocolVersion = "5.3"

// delimiter separates ZeroMQ routing frames from a message's own frames.
const delimiter = "<IDS|MSG>"

// Header is a message header (and, as parent_header, the header of the request it answers).
type Header struct {
	MsgID    string `json:"msg_id,omitempty"`
	Session  string `json:"session,omitempty"`
	Username string `json:"username,omitempty"`
	Date     string `json:"date,omitempty"`
	MsgType  string `json:"msg_type,omitempty"`
	Version  string `json:"version,omitempty"`
}

// Message is one Jupyter message.
type Message struct {
	Header   Header
	Parent   Header
	Metadata map[string]any
	Content  json.RawMessage
}

// signer signs and checks messages with the session key.
type signer struct{ key []byte }

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	sum := m.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

// encode returns msg's frames (no routing identities: the client's sockets are DEALERs).
func (s signer) encode(msg Message) ([][]byte, error) {
	header, err := json.Marshal(msg.Header)
	if err != nil {
		return nil, err
	}
	parent := []byte("{}")
	if msg.Parent.MsgID != "" {
		if parent, err = json.Marshal(msg.Parent); err != nil {
			return nil, err
		}
	}
	meta := []byte("{}")
	if len(msg.Metadata) > 0 {
		if meta, err = json.Marshal(msg.Metadata); err != nil {
			return nil, err
		}
	}
	content := []byte(msg.Content)
	if len(content) == 0 {
		content = []byte("{}")
	}
	return [][]byte{[]byte(delimiter), s.sign(header, parent, meta, content), header, parent, meta, content}, nil
}

var errBadSignature = errors.New("jupyter: message signature does not match the session key")

// decode parses frames (routing frames or an iopub topic first) and checks the signature.
func (s signer) decode(frames [][]byte) (Message, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != delimiter {
		i++
	}
	if len(frames)-i < 6 {
		return Message{}, fmt.Errorf("jupyter: malformed message (%d frames)", len(frames))
	}
	sig, header, parent, meta, content := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
	if len(s.key) > 0 && !hmac.Equal(sig, s.sign(header, parent, meta, content)) {
		return Message{}, errBadSignature
	}
	var msg Message
	if err := json.Unmarshal(header, &msg.Header); err != nil {
		return Message{}, fmt.Errorf("jupyter: message header: %w", err)
	}
	if err := json.Unmarshal(parent, &msg.Parent); err != nil {
		return Message{}, fmt.Errorf("jupyter: parent header: %w", err)
	}
	if len(meta) > 0 {
		_ = json.Unmarshal(meta, &msg.Metadata) // metadata is informational
	}
	msg.Content = append(json.RawMessage(nil), content...)
	return msg, nil
}

// newID returns a random message or session id.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (k *Kernel) newMessage(msgType string, content any) (Message, error) {
	c, err := json.Marshal(content)
	if err != nil {
		return Message{}, err
	}
	return Message{
		Header: Header{MsgID: newID(), Session: k.session, Username: "vmon", MsgType: msgType,
			Version: protocolVersion, Date: time.Now().UTC().Format(time.RFC3339Nano)},
		Content: c,
	}, nil
}
