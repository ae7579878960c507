package engine

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// quantitySuffixes are the Kubernetes resource.Quantity suffixes for
// bytes: binary (Ki..Ei) and decimal (k..E).
var quantitySuffixes = []struct {
	s string
	m float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
}

// ParseQuantity reads a size the way Kubernetes writes one (100Gi, 1.5T,
// 1048576). A whole module for resource.Quantity would be more than this
// needs.
func ParseQuantity(s string) (int64, error) {
	num, mult := s, 1.0
	for _, suf := range quantitySuffixes {
		if strings.HasSuffix(s, suf.s) {
			num, mult = strings.TrimSuffix(s, suf.s), suf.m
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a size (use bytes or a suffix: Ki Mi Gi Ti, k M G T)", s)
	}
	v := math.Ceil(f * mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(v), nil
}
