package csi

import (
	"fmt"
	"testing"

	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%024x", engine.VolumeIDPrefix, i+1)
	}
	return out
}

func TestPaginate(t *testing.T) {
	all := ids(5)
	key := func(s string) string { return s }
	tests := []struct {
		name     string
		items    []string
		token    string
		max      int32
		want     []string
		wantNext string
		wantCode codes.Code
	}{
		{name: "all, no limit", items: all, want: all},
		{name: "first page", items: all, max: 2, want: all[:2], wantNext: all[1]},
		{name: "middle page", items: all, token: all[1], max: 2, want: all[2:4], wantNext: all[3]},
		{name: "last page exact", items: all, token: all[2], max: 2, want: all[3:5]},
		{name: "limit larger than rest", items: all, token: all[3], max: 10, want: all[4:]},
		{name: "token past the end", items: all, token: fmt.Sprintf("%s%024x", engine.VolumeIDPrefix, 99), want: []string{}},
		{name: "token of a deleted entry still works", items: append(append([]string{}, all[:2]...), all[3:]...), token: all[2], max: 1, want: all[3:4], wantNext: all[3]},
		{name: "empty list", items: nil, max: 3, want: []string{}},
		{name: "token zero", items: all, token: "0", wantCode: codes.Aborted},
		{name: "token negative", items: all, token: "-1", wantCode: codes.Aborted},
		{name: "token huge", items: all, token: "99999999999999999999999999", wantCode: codes.Aborted},
		{name: "token garbage", items: all, token: "invalid-token", wantCode: codes.Aborted},
		{name: "snapshot id as volume token", items: all, token: fmt.Sprintf("%s%024x", engine.SnapshotIDPrefix, 1), wantCode: codes.Aborted},
		{name: "negative max", items: all, max: -1, wantCode: codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			page, next, err := paginate(tc.items, tc.token, tc.max, engine.ValidVolumeID, key)
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode {
					t.Fatalf("got %v, want code %v", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(page) != fmt.Sprint(tc.want) || next != tc.wantNext {
				t.Fatalf("got %v next %q, want %v next %q", page, next, tc.want, tc.wantNext)
			}
		})
	}
}

// TestPaginateWalk pages through a list with every page size and checks
// that each entry comes exactly once.
func TestPaginateWalk(t *testing.T) {
	all := ids(23)
	for max := int32(1); max <= 25; max++ {
		var got []string
		token := ""
		for i := 0; ; i++ {
			page, next, err := paginate(all, token, max, engine.ValidVolumeID, func(s string) string { return s })
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, page...)
			if next == "" {
				break
			}
			if i > 30 {
				t.Fatal("pagination does not end")
			}
			token = next
		}
		if fmt.Sprint(got) != fmt.Sprint(all) {
			t.Fatalf("max %d: got %d entries, want %d", max, len(got), len(all))
		}
	}
}

func TestIDs(t *testing.T) {
	id := engine.NewID(engine.VolumeIDPrefix, "0a0b0c0d")
	tests := []struct {
		id   string
		want bool
	}{
		{id, true},
		{"vol-" + "0123456789abcdef01234567", true},
		{"vol-" + "0123456789ABCDEF01234567", false},
		{"vol-../../../etc/passwd", false},
		{"vol-0123456789abcdef0123456/", false},
		{"/vol-0123456789abcdef01234567", false},
		{"vol-0123456789abcdef01234567\x00", false},
		{"snap-0123456789abcdef01234567", false},
		{"", false},
		{"vol-", false},
	}
	for _, tc := range tests {
		if got := engine.ValidVolumeID(tc.id); got != tc.want {
			t.Errorf("validVolumeID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
	if engine.NewID(engine.VolumeIDPrefix, "0a0b0c0d") == id {
		t.Fatal("ids repeat")
	}
}
