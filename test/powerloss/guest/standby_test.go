package guest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/test/kernel/plan"
	"github.com/hostpath-csi/hostpath/transfer"
)

// twoNodes lets two engines in this process pull from each other as the
// transfer does between nodes, with the serving node's authorization.
type twoNodes struct {
	self  string
	nodes map[string]*engine.Engine
}

func (p twoNodes) Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error) {
	for name, e := range p.nodes {
		if engine.NodeTag(name) != tag || name == p.self {
			continue
		}
		if err := e.AuthorizeStandby(p.self, id); err != nil {
			return transfer.Meta{}, nil, name, err
		}
		m, rc, err := e.TransferSource().Open(ctx, p.self, kind, id, statOnly)
		return m, rc, name, err
	}
	return transfer.Meta{}, nil, "", fmt.Errorf("%w: no node has tag %s", transfer.ErrUnreachable, tag)
}

// standbyRounds is how many generations the standby copy pulls.
const standbyRounds = 4

// standbyGenerations keeps a standby copy on the logged disk: a primary
// engine (node-a) with a 16 MiB block volume on the guest's own memory,
// and a standby engine (node-b) whose state dir is standby on the logged
// file system, pulling a generation after each write on the primary. Each
// round acknowledges the volume's content before the pull (standby-data)
// and the generation the pull committed (standby-gen): the host checks at
// every point that each generation file there is whole (its content one
// the volume had) and that an acknowledged generation, or a newer one, is
// held.
func standbyGenerations(t *testing.T, rec *recorder, standby string) {
	ctx := context.Background()
	open := func(node, state string) *engine.Engine {
		e, err := engine.Open(engine.Config{DriverName: "hostpath.csi.k8s.io", Version: "powerloss", NodeID: node,
			StateDir: state, MaxVolumeSize: 1 << 30}, func(string, int64) {})
		if err != nil {
			t.Fatalf("opening %s's engine on %s: %v", node, state, err)
		}
		return e
	}
	primaryState := "/tmp/powerloss-primary"
	defer os.RemoveAll(primaryState)
	a, b := open("node-a", primaryState), open("node-b", standby)
	defer a.Close()
	defer b.Close()
	nodes := map[string]*engine.Engine{"node-a": a, "node-b": b}
	b.SetPeers(twoNodes{"node-b", nodes})
	pool, err := a.ChoosePool(nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := a.MakeVolume(ctx, engine.VolumeSpec{Name: "standby", Access: engine.AccessBlock, Pool: pool, Capacity: engine.SizeRange{Required: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	img := a.VolumeDataPath(v)
	defer engine.DetachAll(img)
	v.Standby = "node-b"
	if err := a.Records.Volumes.Put(v); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AddStandby(engine.StandbySpec{Volume: v.ID, Primary: "node-a", Access: engine.AccessBlock}); err != nil {
		t.Fatal(err)
	}
	rec.ack(t, plan.Op{Kind: "standby", ID: v.ID})
	for round := range standbyRounds {
		// The first round 2 MiB, each later one 512 KiB more, somewhere
		// else: the first pull brings the data, the later ones changes.
		n := int64(512 << 10)
		if round == 0 {
			n = 2 << 20
		}
		f, err := os.OpenFile(img, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(round*59 + i*11 + i/4096 | 1)
		}
		_, err = f.WriteAt(buf, int64(round)*(3<<20))
		if err == nil {
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		content, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		want := sum(content)
		rec.ack(t, plan.Op{Kind: "standby-data", ID: v.ID, Sum: want})
		st, err := b.CatchUp(ctx, v.ID)
		if err != nil {
			t.Fatalf("the standby's pull %d: %v", round, err)
		}
		rec.ack(t, plan.Op{Kind: "standby-gen", ID: v.ID, Gen: st.Generation, Sum: want, Bytes: st.Bytes})
	}
	fmt.Printf("powerloss workload: a standby copy pulled %d generations on %s\n", standbyRounds, filepath.Base(standby))
}
