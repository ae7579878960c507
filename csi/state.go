package csi

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/fsops"
)

// Phases of a record. A record is written in phaseCreating before any data
// exists and in phaseDeleting before any data is removed, so that after a
// crash startup knows which half-made or half-removed things to clear away.
const (
	phaseCreating = "creating"
	phaseReady    = "ready"
	phaseDeleting = "deleting"
)

// Access types of a volume.
const (
	accessMount = "mount"
	accessBlock = "block"
)

// publication is one NodePublishVolume target of a volume on this node.
type publication struct {
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// SingleWriter is set for SINGLE_NODE_SINGLE_WRITER, which allows only
	// one target at a time.
	SingleWriter bool `json:"singleWriter,omitempty"`
}

// volumeRecord is what the driver keeps about one volume.
type volumeRecord struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	CapacityBytes  int64             `json:"capacityBytes"`
	AccessType     string            `json:"accessType"`
	Phase          string            `json:"phase"`
	Kind           string            `json:"kind,omitempty"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	SourceSnapshot string            `json:"sourceSnapshot,omitempty"`
	SourceVolume   string            `json:"sourceVolume,omitempty"`
	CreatedAt      time.Time         `json:"createdAt"`
	Staged         []string          `json:"staged,omitempty"`
	Published      []publication     `json:"published,omitempty"`
	AttachedNodes  []string          `json:"attachedNodes,omitempty"`
	// ProjectID is the volume's project quota id, where project quotas
	// limit directory volumes.
	ProjectID uint32 `json:"projectId,omitempty"`
	// Mutable are the VolumeAttributesClass parameters in force.
	Mutable map[string]string `json:"mutable,omitempty"`
	// LocalPath is the node directory a static local volume shows.
	LocalPath string `json:"localPath,omitempty"`
}

func (v volumeRecord) clone() volumeRecord {
	v.Parameters = maps.Clone(v.Parameters)
	v.Mutable = maps.Clone(v.Mutable)
	v.Staged = slices.Clone(v.Staged)
	v.Published = slices.Clone(v.Published)
	v.AttachedNodes = slices.Clone(v.AttachedNodes)
	return v
}

// snapshotRecord is what the driver keeps about one snapshot.
type snapshotRecord struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	SourceVolume string    `json:"sourceVolume"`
	AccessType   string    `json:"accessType"`
	Phase        string    `json:"phase"`
	CreatedAt    time.Time `json:"createdAt"`
	// SizeBytes is what the snapshot really occupies.
	SizeBytes int64 `json:"sizeBytes"`
	// VolumeBytes is the size of the volume it was taken from, the least a
	// volume restored from it may have.
	VolumeBytes int64  `json:"volumeBytes"`
	SHA256      string `json:"sha256,omitempty"`
	Format      string `json:"format,omitempty"`
	// Group is the group snapshot this snapshot belongs to, if any.
	Group string `json:"group,omitempty"`
}

// groupRecord is a VolumeGroupSnapshot: a set of snapshots made together.
type groupRecord struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Phase     string    `json:"phase"`
	CreatedAt time.Time `json:"createdAt"`
	// Volumes and Snapshots are parallel: Snapshots[i] is of Volumes[i].
	Volumes   []string `json:"volumes"`
	Snapshots []string `json:"snapshots"`
}

// store keeps one JSON file per record, each replaced atomically, so a
// change to one volume costs one small write whatever the number of volumes,
// and a crash loses at most the change in flight. The maps are the
// in-memory index; mu guards them and is never held across I/O.
type store struct {
	volDir, snapDir string

	mu        sync.RWMutex
	volumes   map[string]volumeRecord
	volByName map[string]string
	snaps     map[string]snapshotRecord
	snapName  map[string]string
	groupDir  string
	groups    map[string]groupRecord
	groupName map[string]string
}

func newStore(metaDir string) (*store, error) {
	s := &store{
		volDir:    filepath.Join(metaDir, "volumes"),
		snapDir:   filepath.Join(metaDir, "snapshots"),
		volumes:   map[string]volumeRecord{},
		volByName: map[string]string{},
		snaps:     map[string]snapshotRecord{},
		snapName:  map[string]string{},
		groupDir:  filepath.Join(metaDir, "groups"),
		groups:    map[string]groupRecord{},
		groupName: map[string]string{},
	}
	for _, d := range []string{s.volDir, s.snapDir, s.groupDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// load reads every record. A file that does not parse is reported, not
// skipped: losing track of a volume silently is worse than not starting.
func (s *store) load() error {
	if err := loadDir(s.volDir, validVolumeID, func(data []byte) error {
		var v volumeRecord
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		s.volumes[v.ID] = v
		s.volByName[v.Name] = v.ID
		return nil
	}); err != nil {
		return err
	}
	if err := loadDir(s.snapDir, validSnapshotID, func(data []byte) error {
		var r snapshotRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return err
		}
		s.snaps[r.ID] = r
		s.snapName[r.Name] = r.ID
		return nil
	}); err != nil {
		return err
	}
	return loadDir(s.groupDir, validGroupID, func(data []byte) error {
		var g groupRecord
		if err := json.Unmarshal(data, &g); err != nil {
			return err
		}
		s.groups[g.ID] = g
		s.groupName[g.Name] = g.ID
		return nil
	})
}

func (s *store) getGroup(id string) (groupRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	g, ok := s.groups[id]
	return g, ok
}

func (s *store) groupByName(name string) (groupRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.groupName[name]
	if !ok {
		return groupRecord{}, false
	}
	return s.groups[id], true
}

func (s *store) allGroups() []groupRecord {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]groupRecord, 0, len(s.groups))
	for _, g := range s.groups {
		out = append(out, g)
	}
	return out
}

func (s *store) putGroup(g groupRecord) error {
	if err := writeRecord(s.groupDir, g.ID, g); err != nil {
		return err
	}
	s.mu.Lock()
	s.groups[g.ID] = g
	s.groupName[g.Name] = g.ID
	s.mu.Unlock()
	return nil
}

func (s *store) dropGroup(id string) error {
	if err := fsops.RemoveDurable(filepath.Join(s.groupDir, id+".json")); err != nil {
		return err
	}
	s.mu.Lock()
	if g, ok := s.groups[id]; ok && s.groupName[g.Name] == id {
		delete(s.groupName, g.Name)
	}
	delete(s.groups, id)
	s.mu.Unlock()
	return nil
}

func loadDir(dir string, valid func(string) bool, add func([]byte) error) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !valid(id) {
			// Temporary files of an interrupted atomic write.
			if strings.HasPrefix(e.Name(), ".") {
				os.Remove(filepath.Join(dir, e.Name()))
			}
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		if err := add(data); err != nil {
			return fmt.Errorf("state file %s is damaged: %w", filepath.Join(dir, e.Name()), err)
		}
	}
	return nil
}

func writeRecord(dir, id string, rec any) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return fsops.WriteFileAtomic(filepath.Join(dir, id+".json"), data, 0o600)
}

// getVolume returns a copy of the record.
func (s *store) getVolume(id string) (volumeRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.volumes[id]
	return v.clone(), ok
}

func (s *store) volumeByName(name string) (volumeRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.volByName[name]
	if !ok {
		return volumeRecord{}, false
	}
	return s.volumes[id].clone(), true
}

// reserveVolume enters a new record in the index, without writing it, if
// no volume has its name and check (run under the index lock, so two
// creates cannot both take the last bytes) agrees. The caller persists it.
func (s *store) reserveVolume(v *volumeRecord, check func(v *volumeRecord, all map[string]volumeRecord) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.volByName[v.Name]; ok {
		return status.Errorf(codes.Aborted, "volume name %q is being created by another request", v.Name)
	}
	if check != nil {
		if err := check(v, s.volumes); err != nil {
			return err
		}
	}
	s.volumes[v.ID] = v.clone()
	s.volByName[v.Name] = v.ID
	return nil
}

// unreserveVolume takes a reservation whose record was never written out
// of the index. The index is what answers "name taken", so it must go even
// when the state dir refuses every write.
func (s *store) unreserveVolume(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.volumes[id]; ok && s.volByName[v.Name] == id {
		delete(s.volByName, v.Name)
	}
	delete(s.volumes, id)
}

// unreserveSnapshot is unreserveVolume for a snapshot.
func (s *store) unreserveSnapshot(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.snaps[id]; ok && s.snapName[r.Name] == id {
		delete(s.snapName, r.Name)
	}
	delete(s.snaps, id)
}

// checkVolumes runs check with every record in view, under the index lock.
func (s *store) checkVolumes(check func(all map[string]volumeRecord) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return check(s.volumes)
}

// putVolume writes the record durably, then updates the index.
func (s *store) putVolume(v volumeRecord) error {
	if err := writeRecord(s.volDir, v.ID, v); err != nil {
		return err
	}
	s.mu.Lock()
	s.volumes[v.ID] = v.clone()
	s.volByName[v.Name] = v.ID
	s.mu.Unlock()
	return nil
}

// dropVolume removes the record from disk and from the index.
func (s *store) dropVolume(id string) error {
	if err := fsops.RemoveDurable(filepath.Join(s.volDir, id+".json")); err != nil {
		return err
	}
	s.mu.Lock()
	if v, ok := s.volumes[id]; ok && s.volByName[v.Name] == id {
		delete(s.volByName, v.Name)
	}
	delete(s.volumes, id)
	s.mu.Unlock()
	return nil
}

// volumes returns copies of all records, sorted by id.
func (s *store) allVolumes() []volumeRecord {
	s.mu.RLock()
	out := make([]volumeRecord, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, v.clone())
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b volumeRecord) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (s *store) getSnapshot(id string) (snapshotRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.snaps[id]
	return r, ok
}

func (s *store) snapshotByName(name string) (snapshotRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.snapName[name]
	if !ok {
		return snapshotRecord{}, false
	}
	return s.snaps[id], true
}

func (s *store) reserveSnapshot(r snapshotRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snapName[r.Name]; ok {
		return status.Errorf(codes.Aborted, "snapshot name %q is being created by another request", r.Name)
	}
	s.snaps[r.ID] = r
	s.snapName[r.Name] = r.ID
	return nil
}

func (s *store) putSnapshot(r snapshotRecord) error {
	if err := writeRecord(s.snapDir, r.ID, r); err != nil {
		return err
	}
	s.mu.Lock()
	s.snaps[r.ID] = r
	s.snapName[r.Name] = r.ID
	s.mu.Unlock()
	return nil
}

func (s *store) dropSnapshot(id string) error {
	if err := fsops.RemoveDurable(filepath.Join(s.snapDir, id+".json")); err != nil {
		return err
	}
	s.mu.Lock()
	if r, ok := s.snaps[id]; ok && s.snapName[r.Name] == id {
		delete(s.snapName, r.Name)
	}
	delete(s.snaps, id)
	s.mu.Unlock()
	return nil
}

func (s *store) allSnapshots() []snapshotRecord {
	s.mu.RLock()
	out := make([]snapshotRecord, 0, len(s.snaps))
	for _, r := range s.snaps {
		out = append(out, r)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b snapshotRecord) int { return strings.Compare(a.ID, b.ID) })
	return out
}
