package iolimit

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher tells of the cgroups made below watched cgroups (inotify): on
// cgroup v1 a container's cgroup is made after its pod's, and takes a
// limit only when it is written there, so the sooner the better (runc
// makes the cgroup before it starts the container's process).
type Watcher struct {
	f      *os.File
	events chan string

	mu   sync.Mutex
	wds  map[int]string // watch descriptor to directory
	dirs map[string]int
}

// NewWatcher starts a watcher; Close ends it.
func NewWatcher() (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	// Through the runtime's poller: Close wakes the reader.
	w := &Watcher{f: os.NewFile(uintptr(fd), "inotify"), events: make(chan string, 256),
		wds: map[int]string{}, dirs: map[string]int{}}
	go w.read()
	return w, nil
}

// Events are the directories made below watched ones. A full channel
// drops events: the caller's periodic pass is the backstop.
func (w *Watcher) Events() <-chan string { return w.events }

// Add watches dir for directories made in it; a dir watched already is
// left as it is.
func (w *Watcher) Add(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.dirs[dir]; ok {
		return nil
	}
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), dir, unix.IN_CREATE|unix.IN_ONLYDIR)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.wds[wd], w.dirs[dir] = dir, wd
	return nil
}

// Watching says whether dir is watched.
func (w *Watcher) Watching(dir string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.dirs[dir]
	return ok
}

// Close ends the watcher and its events channel.
func (w *Watcher) Close() error { return w.f.Close() }

func (w *Watcher) read() {
	defer close(w.events)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			w.mu.Lock()
			dir, ok := w.wds[int(ev.Wd)]
			if ev.Mask&unix.IN_IGNORED != 0 && ok { // the directory went
				delete(w.wds, int(ev.Wd))
				delete(w.dirs, dir)
			}
			w.mu.Unlock()
			if !ok || ev.Mask&unix.IN_CREATE == 0 || ev.Mask&unix.IN_ISDIR == 0 {
				continue
			}
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			select {
			case w.events <- filepath.Join(dir, string(name)):
			default:
			}
		}
	}
}
