// Package dm makes device-mapper devices by ioctl on /dev/mapper/control,
// for the kernel guests' tests, which have no dmsetup: a log-writes target
// over a data disk and a log disk with marks in its log (make
// test-powerloss), flakey tables swapped in and out under a mounted file
// system (the device-fault tests), and removal. It is test
// infrastructure: the driver never uses device-mapper.
package dm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ioctl interface of include/uapi/linux/dm-ioctl.h, version 4.
const (
	ioctlSize    = 312 // sizeof(struct dm_ioctl)
	specSize     = 40  // sizeof(struct dm_target_spec)
	nameLen      = 128
	cmdDevCreate = 3
	cmdDevRemove = 4
	cmdSuspend   = 6
	cmdTableLoad = 9
	cmdTargetMsg = 14

	flagSuspend    = 1 << 1  // DM_SUSPEND_FLAG
	flagSkipLockfs = 1 << 10 // DM_SKIP_LOCKFS_FLAG: do not freeze the file system on top
)

func ioctlNum(cmd uintptr) uintptr {
	return 3<<30 | ioctlSize<<16 | 0xfd<<8 | cmd // _IOWR(DM_IOCTL, cmd, struct dm_ioctl)
}

// header is struct dm_ioctl.
type header struct {
	Version     [3]uint32
	DataSize    uint32
	DataStart   uint32
	TargetCount uint32
	OpenCount   int32
	Flags       uint32
	EventNr     uint32
	Padding     uint32
	Dev         uint64
	Name        [nameLen]byte
	UUID        [129]byte
	Data        [7]byte
}

// Target is one line of a table: start and length in 512-byte sectors,
// the target type and its parameters.
type Target struct {
	Start, Length uint64
	Type, Params  string
}

func call(cmd uintptr, name string, flags uint32, targets int, payload []byte) (header, error) {
	var h header
	h.Version = [3]uint32{4, 0, 0}
	h.DataStart = ioctlSize
	h.DataSize = uint32(ioctlSize + len(payload))
	h.TargetCount = uint32(targets)
	h.Flags = flags
	copy(h.Name[:nameLen-1], name)
	buf := new(bytes.Buffer)
	if err := binary.Write(buf, binary.LittleEndian, &h); err != nil {
		return h, err
	}
	if buf.Len() != ioctlSize {
		return h, fmt.Errorf("dm_ioctl is %d bytes, want %d", buf.Len(), ioctlSize)
	}
	buf.Write(payload)
	// Room for what the kernel writes back.
	b := append(buf.Bytes(), make([]byte, 16<<10)...)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(b)))
	ctl, err := os.OpenFile("/dev/mapper/control", os.O_RDWR, 0)
	if err != nil {
		return h, err
	}
	defer ctl.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, ctl.Fd(), ioctlNum(cmd), uintptr(unsafe.Pointer(&b[0]))); errno != 0 {
		return h, fmt.Errorf("device-mapper ioctl %d on %s: %w", cmd, name, errno)
	}
	err = binary.Read(bytes.NewReader(b[:ioctlSize]), binary.LittleEndian, &h)
	return h, err
}

// Create makes device name with the table and resumes it, returning its
// node (/dev/dm-N, made by devtmpfs).
func Create(name string, table []Target) (string, error) {
	if _, err := call(cmdDevCreate, name, 0, 0, nil); err != nil {
		return "", err
	}
	if err := load(name, table); err != nil {
		_ = Remove(name) // the load's error is the one to report
		return "", err
	}
	h, err := call(cmdSuspend, name, 0, 0, nil) // no suspend flag: resume, making the table live
	if err != nil {
		_ = Remove(name)
		return "", err
	}
	minor := (h.Dev & 0xff) | ((h.Dev >> 12) & 0xfff00)
	return fmt.Sprintf("/dev/dm-%d", minor), nil
}

// load loads table as name's inactive table.
func load(name string, table []Target) error {
	var payload bytes.Buffer
	for _, t := range table {
		params := append([]byte(t.Params), 0)
		for (specSize+len(params))%8 != 0 {
			params = append(params, 0)
		}
		spec := make([]byte, specSize)
		binary.LittleEndian.PutUint64(spec[0:], t.Start)
		binary.LittleEndian.PutUint64(spec[8:], t.Length)
		binary.LittleEndian.PutUint32(spec[20:], uint32(specSize+len(params))) // next, from this spec
		copy(spec[24:40], t.Type)
		payload.Write(spec)
		payload.Write(params)
	}
	_, err := call(cmdTableLoad, name, 0, len(table), payload.Bytes())
	return err
}

// Reload swaps device name's table for table while it is in use, as
// "dmsetup suspend --nolockfs; dmsetup load; dmsetup resume" do: I/O in
// flight finishes on the old table, the file system on top is not frozen
// (freezing would write out what a test wants dropped or failed), and new
// I/O goes to the new table.
func Reload(name string, table []Target) error {
	if _, err := call(cmdSuspend, name, flagSuspend|flagSkipLockfs, 0, nil); err != nil {
		return err
	}
	lerr := load(name, table)
	if _, err := call(cmdSuspend, name, 0, 0, nil); err != nil {
		return err
	}
	return lerr
}

// Message sends a target message, such as "mark NAME" to log-writes.
func Message(name string, sector uint64, msg string) error {
	payload := make([]byte, 8, 8+len(msg)+8)
	binary.LittleEndian.PutUint64(payload, sector)
	payload = append(payload, msg...)
	payload = append(payload, 0)
	for len(payload)%8 != 0 {
		payload = append(payload, 0)
	}
	_, err := call(cmdTargetMsg, name, 0, 0, payload)
	return err
}

// Remove takes device name away (log-writes writes its log's super block
// as it goes).
func Remove(name string) error {
	_, err := call(cmdDevRemove, name, 0, 0, nil)
	return err
}
