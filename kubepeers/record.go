package kubepeers

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/hostpath-csi/hostpath/transfer"
)

// record is what the signer keeps beside its authority in its Store.
type record struct {
	asked time.Time // a rollover asked for (RollOverKey), or zero
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
	return r, nil
}

// due says, of the newest authority, whether it must be replaced at now:
// a rollover was asked for after it was made.
func (r record) due(now time.Time) func(newest *x509.Certificate) bool {
	asked := r.asked
	if asked.After(now) {
		asked = now // a time to come would roll over every minute until then
	}
	return func(newest *x509.Certificate) bool {
		// An authority is backdated: one made after the request is valid
		// from no earlier than Backdate before it.
		return !asked.IsZero() && newest.NotBefore.Add(transfer.Backdate).Before(asked)
	}
}

// RetireAfter is how long the authority a rollover replaced stays
// trusted (transfer.StoreAuthority.RetireAfter) under a signer that signs
// for at most maxLifetime: every node moves to the new one within
// transfer.Propagation and a refresh, and the longest certificate the old
// one signed ends maxLifetime after that.
func RetireAfter(maxLifetime time.Duration) time.Duration {
	if maxLifetime <= 0 {
		maxLifetime = DefaultMaxCertLifetime
	}
	return transfer.Propagation + 10*time.Minute + maxLifetime
}

func (s *Signer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}
