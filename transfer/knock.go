package transfer

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The knock. Before its TLS handshake, a node (or the controller) that
// dials another's transfer or control port sends a few hundred bytes: the
// time, the name of the node it dials, its certificate, and its signature
// over them. The server's gate checks them at once, before any TLS, and
// admits a connection that proves a certificate of the deployment to
// pending slots of its own, counted by the certificate's name, which
// nothing without a key of the deployment can take. Without it, a pod
// that shares its node's address (masqueraded behind it) and reopens
// connections as fast as they are closed takes that address's pending
// slots from its node's driver: its pulls failed (3 fetches of 5), and
// the gate's eviction by age only made the flood churn.
//
// A knock is not a credential beyond the moment: it names the server (it
// is refused by any other node) and is refused two minutes either side
// of its time. A copy of one could only take a slot of the node it names,
// at that node's cap; the TLS handshake after it is what authenticates.
// A connection without one (a driver of the previous release) is served
// as before, through the slots counted by address; a client whose knock
// is not taken (the server of the previous release, which reads it as a
// broken handshake) dials again without one.

const (
	knockMagic = "HPCSI-K1"
	// knockContext is what a knock's signature is over, before its body:
	// a signature made for anything else is never a knock.
	knockContext = "hostpath-csi knock v1\x00"
	// maxKnock bounds a knock's body (a certificate of a few hundred
	// bytes, a signature, a name).
	maxKnock = 8 << 10
	// knockSkew is how far a knock's time may be from the server's.
	knockSkew = 2 * time.Minute
)

// Knock is what these credentials send before a TLS handshake with
// server (the node dialled): see the comment above.
func (c *Credentials) Knock(server string) ([]byte, error) {
	_, leaf, err := c.current()
	if err != nil {
		return nil, err
	}
	signer, ok := leaf.PrivateKey.(crypto.Signer)
	if !ok || len(leaf.Certificate) == 0 {
		return nil, errors.New("the certificate's key cannot sign")
	}
	if len(server) > 255 {
		return nil, fmt.Errorf("a node name of %d bytes", len(server))
	}
	var body bytes.Buffer
	// Writes to a bytes.Buffer do not fail.
	_ = binary.Write(&body, binary.BigEndian, c.now().Unix())
	body.WriteByte(byte(len(server)))
	body.WriteString(server)
	_ = binary.Write(&body, binary.BigEndian, uint16(len(leaf.Certificate[0])))
	body.Write(leaf.Certificate[0])
	digest := sha256.Sum256(append([]byte(knockContext), body.Bytes()...))
	sig, err := signer.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		return nil, err
	}
	_ = binary.Write(&body, binary.BigEndian, uint16(len(sig)))
	body.Write(sig)
	if body.Len() > maxKnock {
		return nil, fmt.Errorf("a knock of %d bytes", body.Len())
	}
	out := make([]byte, 0, len(knockMagic)+2+body.Len())
	out = append(out, knockMagic...)
	out = binary.BigEndian.AppendUint16(out, uint16(body.Len()))
	return append(out, body.Bytes()...), nil
}

// readKnock reads the rest of a knock whose magic has been read from r,
// and returns the name of the peer it proves (as peerNode names it).
func (c *Credentials) readKnock(r io.Reader) (string, error) {
	var n uint16
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return "", err
	}
	if n > maxKnock {
		return "", fmt.Errorf("a knock of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return c.verifyKnock(b)
}

// verifyKnock checks a knock's body and returns the peer it proves.
func (c *Credentials) verifyKnock(b []byte) (string, error) {
	short := errors.New("a knock cut short")
	if len(b) < 9 {
		return "", short
	}
	ts := int64(binary.BigEndian.Uint64(b))
	rest := b[8:]
	sl := int(rest[0])
	if len(rest) < 1+sl+2 {
		return "", short
	}
	server := string(rest[1 : 1+sl])
	rest = rest[1+sl:]
	cl := int(binary.BigEndian.Uint16(rest))
	if len(rest) < 2+cl+2 {
		return "", short
	}
	der := rest[2 : 2+cl]
	rest = rest[2+cl:]
	signed := b[:len(b)-len(rest)]
	gl := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+gl {
		return "", short
	}
	sig := rest[2:]
	if server != c.Node {
		return "", fmt.Errorf("%w: a knock for %q, not for this node", ErrRefused, server)
	}
	now := c.now()
	if at := time.Unix(ts, 0); at.Before(now.Add(-knockSkew)) || at.After(now.Add(knockSkew)) {
		return "", fmt.Errorf("%w: a knock made at %v, more than %v from now", ErrRefused, at, knockSkew)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", fmt.Errorf("%w: a knock's certificate: %v", ErrRefused, err)
	}
	roots, _, err := c.current()
	if err != nil {
		return "", err
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", fmt.Errorf("%w: a knock's certificate: %v", ErrRefused, err)
	}
	if err := checkLifetime(cert, c.maxPeerLifetime()); err != nil {
		return "", err
	}
	if err := cert.CheckSignature(x509.ECDSAWithSHA256, append([]byte(knockContext), signed...), sig); err != nil {
		return "", fmt.Errorf("%w: a knock's signature: %v", ErrRefused, err)
	}
	name := peerNode(cert, c.Driver)
	if name == "" {
		return "", fmt.Errorf("%w: a knock's certificate names no node of driver %s", ErrRefused, c.Driver)
	}
	return name, nil
}

// KnockOn sends, on conn just dialled to server, the knock for it, if
// these credentials can make one (none to give: the connection is served
// as a driver of before is). The error is the write's.
func (c *Credentials) KnockOn(conn net.Conn, server string) error {
	k, err := c.Knock(server)
	if err != nil {
		return nil
	}
	_, err = conn.Write(k)
	return err
}
