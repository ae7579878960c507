// Package bench measures the driver's data path against the tools a user
// would otherwise run (fallocate, losetup, cp, tar) on the same data in the
// same run, so results read as ratios. Run it as root: make bench.
package bench
