package engine

import (
	"testing"
)

func TestParseQuantity(t *testing.T) {
	tests := map[string]int64{"0": 0, "1": 1, "1Ki": 1024, "100Mi": 100 << 20, "1Ti": 1 << 40, "1G": 1e9, "1.5Gi": 3 << 29, "1k": 1000}
	for in, want := range tests {
		if got, err := ParseQuantity(in); err != nil || got != want {
			t.Errorf("ParseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "Gi", "1Xi", "NaN", "1e400"} {
		if _, err := ParseQuantity(bad); err == nil {
			t.Errorf("ParseQuantity(%q) accepted", bad)
		}
	}
}
