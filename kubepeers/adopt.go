package kubepeers

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/transfer"
)

// The release before the signer kept the transfer authority, key and all,
// in one Secret every node read and wrote. A rolling upgrade has nodes of
// both releases at once, and the old ones trust only that authority (they
// can no longer read the Secret once the new RBAC is applied, and keep
// what they hold). So the signer adopts it:
//
//   - On its first start (no authority of its own yet) it takes the
//     Secret's authority as its own, notes when the adoption ends
//     (AdoptFor), and removes the key from the Secret: no node reads it
//     again. What the Secret holds then is adopted, once; an authority
//     written there later is never trusted.
//   - Until the adoption ends it signs with that key, so a new node's
//     certificate is trusted by the old nodes, and theirs by it.
//   - Then it rolls over to an authority of its own making (the key that
//     every node could read signs nothing more), and once every
//     certificate the adopted authority signed has ended (the signer's cap
//     and a node's move to the new authority later) it stops publishing it
//     and deletes the old Secret.

// Keys the Signer keeps beside its authority in its own Store.
const (
	adoptedKey      = "adopted.crt"   // the authorities adopted, PEM
	adoptedUntilKey = "adopted.until" // RFC 3339: when signing with them ends
)

// DefaultAdoptFor is how long an adopted authority keeps signing: longer
// than any rolling upgrade of the drivers.
const DefaultAdoptFor = 24 * time.Hour

func (s *Signer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// adopt takes the Legacy Secret's authority as the signer's own; Publish
// calls it when the signer has none yet (see above).
func (s *Signer) adopt(ctx context.Context) error {
	if s.Legacy == nil {
		return nil
	}
	data, _, err := s.Legacy.Load(ctx)
	if errors.Is(err, transfer.ErrNoAuthority) {
		return nil // a new deployment: nothing to adopt
	}
	if err != nil {
		return err
	}
	now := s.now()
	if _, key, err := transfer.ParseAuthority(data, now); err != nil || key == nil {
		return nil // nothing that can sign: the signer makes its own
	}
	adoptFor := s.AdoptFor
	if adoptFor <= 0 {
		adoptFor = DefaultAdoptFor
	}
	own := map[string][]byte{
		transfer.CertsKey: data[transfer.CertsKey], transfer.KeyKey: data[transfer.KeyKey],
		adoptedKey: data[transfer.CertsKey], adoptedUntilKey: []byte(now.Add(adoptFor).UTC().Format(time.RFC3339)),
	}
	if err := s.Authority.Store.Save(ctx, own, ""); err != nil && !errors.Is(err, transfer.ErrConflict) {
		return err
	}
	// The key leaves the Secret every node could read; its certificates
	// stay, and so does the Secret (its owner deletes it with the
	// deployment, or the signer when the adoption is over).
	secrets := s.Legacy.Client.CoreV1().Secrets(s.Legacy.Namespace)
	sec, err := secrets.Get(ctx, s.Legacy.Name, metav1.GetOptions{})
	if err != nil {
		return ignoreNotFound(err)
	}
	if _, ok := sec.Data[transfer.KeyKey]; ok {
		sec = sec.DeepCopy()
		delete(sec.Data, transfer.KeyKey)
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations["hostpath.csi/what"] = "the authority of the release before the transfer's signer, adopted by it (" + s.Name + "); its key was removed; the signer deletes it when the adoption ends"
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// record is what the signer keeps beside its authority in its Store.
type record struct {
	adopted []*x509.Certificate // the authorities adopted, if any
	until   time.Time           // when signing with them ends
	asked   time.Time           // a rollover asked for (RollOverKey), or zero
}

func parseRecord(data map[string][]byte) (record, error) {
	var r record
	if v := strings.TrimSpace(string(data[RollOverKey])); v != "" {
		asked, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return r, fmt.Errorf("%s in the signer's Secret is %q, not an RFC 3339 time", RollOverKey, v)
		}
		r.asked = asked
	}
	if len(data[adoptedKey]) == 0 {
		return r, nil
	}
	until, err := time.Parse(time.RFC3339, string(data[adoptedUntilKey]))
	if err != nil {
		return r, fmt.Errorf("the signer's record of its adoption is damaged: %w", err)
	}
	if r.adopted, err = transfer.ParseCertificates(data[adoptedKey], time.Time{}); err != nil {
		return r, err
	}
	r.until = until
	return r, nil
}

func (r record) isAdopted(c *x509.Certificate) bool {
	for _, a := range r.adopted {
		if a.Equal(c) {
			return true
		}
	}
	return false
}

// due says, of the newest authority, whether it must be replaced at now:
// a rollover was asked for after it was made, or it is an adopted one
// whose adoption has ended.
func (r record) due(now time.Time) func(newest *x509.Certificate) bool {
	asked := r.asked
	if asked.After(now) {
		asked = now // a time to come would roll over every minute until then
	}
	return func(newest *x509.Certificate) bool {
		// An authority is backdated: one made after the request is valid
		// from no earlier than Backdate before it.
		if !asked.IsZero() && newest.NotBefore.Add(transfer.Backdate).Before(asked) {
			return true
		}
		return r.isAdopted(newest) && !now.Before(r.until)
	}
}

// retireAdopted leaves the adopted authorities out of what is trusted once
// what they signed has ended, and deletes the old Secret then.
func (s *Signer) retireAdopted(ctx context.Context, r record, cas []*x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	// A node moves to the new authority within Propagation and a few
	// minutes of refreshing; its certificate from the adopted one lasts
	// at most the signer's cap.
	if len(r.adopted) == 0 || now.Before(r.until.Add(transfer.Propagation+10*time.Minute+s.maxLifetime())) {
		return cas, nil
	}
	var own []*x509.Certificate
	for _, c := range cas {
		if !r.isAdopted(c) {
			own = append(own, c)
		}
	}
	if s.Legacy != nil && !s.legacyGone.Load() {
		err := s.Legacy.Client.CoreV1().Secrets(s.Legacy.Namespace).Delete(ctx, s.Legacy.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		s.legacyGone.Store(true)
	}
	return own, nil
}
