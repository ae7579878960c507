package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
)

// baseVersion is the release this tree is heading for; a build from a
// module version (go install ...@vX) reports that version instead.
const baseVersion = "v0.2.0"

// version comes from the build info, so a plain go build gives a working
// GetPluginInfo with no ldflags.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return baseVersion + "-dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	v := baseVersion + "-dev"
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// options is the command line.
type options struct {
	cfg         engine.Config
	showVersion bool
	// httpEndpoint serves /healthz and /metrics.
	httpEndpoint string
	// labelImported runs snapimport's Labeler when the driver runs in a
	// cluster.
	labelImported bool
	// reportLostNodes runs lostnodes' Watcher when the driver runs in a
	// cluster.
	reportLostNodes bool
	// metricsAuth guards /metrics with the API server's reviews when the
	// driver runs in a cluster.
	metricsAuth bool
	// transferEndpoint serves this node's snapshots and volumes to the
	// other nodes' drivers (package transfer) and lets restores and clones
	// pull from them, when the driver runs in a cluster.
	transferEndpoint string
	// controlEndpoint serves, on a node, the controller's calls about the
	// node's volumes (package route); in controller mode its port is the
	// one dialled at each node.
	controlEndpoint string
	// transferTrust is the ConfigMap in which the transfer signer
	// publishes the authorities to trust; a node's own certificate comes
	// from that signer through the CSR API.
	transferTrust string
	// mode is "driver" (the CSI driver of a node) or "transfer-signer"
	// (the approver and signer of the nodes' transfer certificates).
	mode string
	// signer is the transfer-signer mode's settings.
	signer signerOptions
	// pluginRegistrationPath and kubeletRegistrationPath switch on
	// in-process kubelet registration (the names the registrar sidecar
	// uses): kubelet's plugins_registry directory as this process sees it,
	// and the CSI socket as kubelet sees it on the host.
	pluginRegistrationPath  string
	kubeletRegistrationPath string
	// markPool, when set, marks that pool's directory (a new disk for a
	// pool the state dir knows) and exits: engine.MarkPool.
	markPool string
	// warnings are one line each about flags accepted for compatibility
	// that change nothing here; main logs them at start.
	warnings []string
}

// capacityFlag collects repeated --capacity kind=quantity.
type capacityFlag map[string]int64

func (c capacityFlag) String() string { return fmt.Sprint(map[string]int64(c)) }

func (c capacityFlag) Set(s string) error {
	kind, qty, ok := strings.Cut(s, "=")
	if !ok || kind == "" {
		return fmt.Errorf("want kind=quantity (for example fast=100Gi), got %q", s)
	}
	n, err := engine.ParseQuantity(qty)
	if err != nil {
		return err
	}
	if _, dup := c[kind]; dup {
		return fmt.Errorf("kind %q given twice", kind)
	}
	c[kind] = n
	return nil
}

// poolFlag collects repeated --pool name=path.
type poolFlag map[string]string

func (f poolFlag) String() string { return fmt.Sprint(map[string]string(f)) }

func (f poolFlag) Set(s string) error {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want name=path (for example hdd=/mnt/hdd/hostpath), got %q", s)
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("pool %q given twice", name)
	}
	f[name] = path
	return nil
}

// stringList collects a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// quantityFlag is a size flag that takes Kubernetes quantities.
type quantityFlag struct{ v *int64 }

func (q quantityFlag) String() string {
	if q.v == nil {
		return "0"
	}
	return fmt.Sprint(*q.v)
}
func (q quantityFlag) Set(s string) error {
	n, err := engine.ParseQuantity(s)
	if err == nil {
		*q.v = n
	}
	return err
}

// parseFlags parses args (without the program name). Every problem comes
// back as one error line that says what to fix.
func parseFlags(args []string) (options, error) {
	o := options{cfg: engine.Config{
		DriverName:            "hostpath.csi.k8s.io",
		StateDir:              "/csi-data-dir",
		Endpoint:              "unix:///tmp/csi.sock",
		MaxVolumeSize:         1 << 40,
		MaxInlineSize:         1 << 30,
		EnableTopology:        true,
		EnableVolumeExpansion: true,
		Version:               version(),
	}}
	capacity := capacityFlag{}
	var localRoots stringList
	fs := flag.NewFlagSet("hostpathplugin", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.cfg.Endpoint, "endpoint", o.cfg.Endpoint, "CSI endpoint: unix:///path/to/csi.sock or a path")
	fs.StringVar(&o.cfg.NodeID, "nodeid", "", "node id (required)")
	fs.StringVar(&o.cfg.DriverName, "drivername", o.cfg.DriverName, "name of the driver")
	fs.StringVar(&o.cfg.StateDir, "statedir", o.cfg.StateDir, "directory for volumes, snapshots and state")
	fs.Int64Var(&o.cfg.MaxVolumesPerNode, "maxvolumespernode", 0, "volumes this node may have published, 0 for no limit")
	fs.Var(quantityFlag{&o.cfg.MaxVolumeSize}, "max-volume-size", "largest volume to create (quantity, e.g. 1Ti)")
	fs.Var(quantityFlag{&o.cfg.MaxInlineSize}, "max-inline-size", "largest inline ephemeral volume a pod may ask for (quantity; 0 for --max-volume-size alone): nothing counts them against a quota")
	fs.Var(&localRoots, "local-root", "a directory static local volumes may come from (repeatable)")
	pools := poolFlag{}
	fs.Var(pools, "pool", "a storage pool beside the state dir's own (\"default\"): name=path, a directory on a file system of its own (repeatable); a StorageClass or VolumeSnapshotClass chooses it with the parameter pool")
	fs.Var(capacity, "capacity", "simulate capacity for a StorageClass kind: kind=quantity (repeatable)")
	fs.BoolVar(&o.cfg.EnableTopology, "enable-topology", true, "report node topology")
	fs.BoolVar(&o.cfg.EnableVolumeExpansion, "enable-volume-expansion", true, "offer volume expansion")
	fs.BoolVar(&o.cfg.EnableAttach, "enable-attach", false, "offer ControllerPublish/Unpublish")
	fs.BoolVar(&o.cfg.EnableSnapshotMetadata, "enable-snapshot-metadata", false, "serve the SnapshotMetadata service (allocated and changed ranges of block snapshots)")
	fs.BoolVar(&o.cfg.EnableModifyVolume, "enable-controller-modify-volume", false, "offer ControllerModifyVolume (VolumeAttributesClass): mutable kind, snapshotFormat, snapshotCompression, and the I/O limits readIOPS, writeIOPS, readBytesPerSecond, writeBytesPerSecond of image and block volumes")
	fs.StringVar(&o.cfg.CgroupMount, "cgroup-mount", "/sys/fs/cgroup", "where the host's cgroup file systems are mounted in the driver's container: I/O limits are written into the cgroups of the pods that publish a limited volume (a container's own /sys/fs/cgroup shows only its own cgroup)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.markPool, "mark-pool", "", "mark the directory of --pool NAME=PATH as that pool's (a new disk for a pool this state dir already knows, which the driver never marks by itself), print what was done and exit; a running driver brings the pool up within 10 s")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "address for /healthz and /metrics, e.g. :8080 (off when empty)")
	fs.StringVar(&o.pluginRegistrationPath, "plugin-registration-path", "", "kubelet's plugins_registry dir as mounted here; with --kubelet-registration-path, register with kubelet in-process")
	fs.StringVar(&o.kubeletRegistrationPath, "kubelet-registration-path", "", "the CSI socket path as kubelet sees it on the host")
	fs.BoolVar(&o.labelImported, "label-imported-snapshots", false, "in a cluster, give imported VolumeSnapshotContents of this driver whose snapshot is on this node the managed-by label naming it, for a csi-snapshotter run on each node (--node-deployment); deploy/'s controller needs none, and its nodes' account may not list, watch or patch contents")
	fs.BoolVar(&o.metricsAuth, "metrics-auth", true, "in a cluster, /metrics answers only a bearer token whose user may get /metrics (TokenReview and SubjectAccessReview, as kube-rbac-proxy does): its series name volumes and host paths; false serves it to anyone who reaches the port")
	fs.BoolVar(&o.reportLostNodes, "report-lost-nodes", true, "in a cluster, put a Warning event naming the node on each Pending pod (and its claim) that waits for a volume of this driver whose node has left the cluster (one driver of the deployment reports)")
	fs.StringVar(&o.transferEndpoint, "transfer-endpoint", ":9470", "in a cluster, the address that serves this node's snapshots and volumes to the other nodes' drivers (mutual TLS), so a restore or clone on any node can pull its source; the port must be reachable at each node's internal IP (a hostPort); off when empty")
	var transferAuthority string
	fs.StringVar(&transferAuthority, "transfer-authority", "signer", "accepted for compatibility: signer, the only mode (a node asks the Kubernetes CSR API for its transfer certificate, and the transfer signer, --mode=transfer-signer, grants a node only its own name)")
	fs.StringVar(&o.transferTrust, "transfer-trust", "hostpath-csi-transfer-trust", "the ConfigMap, in the driver's namespace, in which the transfer signer publishes the authorities the nodes trust")
	fs.StringVar(&o.mode, "mode", "driver", "driver (the CSI driver of a node), controller (one Deployment beside the csi-snapshotter and csi-resizer: forwards their calls to the node that holds each volume, over the transfer's mutual TLS) or transfer-signer (the approver and signer of the transfer certificates: one small Deployment, the only holder of the signing key)")
	fs.StringVar(&o.controlEndpoint, "control-endpoint", ":9471", "in a cluster, the address at which a node takes the controller's calls (snapshots, expansion) about its volumes, mutual TLS, only from the controller; controller mode dials this port at each node's internal IP; off when empty")
	fs.StringVar(&o.signer.controller, "controller-requester", "hostpath-csi-controller", "transfer-signer mode: the service account, in the signer's namespace, of the controller (--mode=controller), whose requests are granted the controller's certificate, from a Deployment's pod only; empty grants none")
	fs.StringVar(&o.signer.requester, "transfer-requester", "hostpath-csi-node", "transfer-signer mode: the service account, in the signer's namespace, of the drivers whose requests are granted (each only for the node its token is bound to)")
	fs.StringVar(&o.signer.keySecret, "transfer-signer-secret", "hostpath-csi-transfer-signer", "transfer-signer mode: the Secret, in its namespace, where the signer keeps its authority's key (only its own service account may read it)")
	fs.DurationVar(&o.signer.maxLifetime, "transfer-max-cert-lifetime", 6*time.Hour, "transfer-signer mode: the longest a node's certificate is signed for (renewed at half of it)")
	fs.IntVar(&o.cfg.MaxHeavyOps, "max-heavy-operations", 4, "clones, snapshots and restores that may run at once")
	fs.DurationVar(&o.cfg.ProgressInterval, "progress-interval", 10*time.Second, "how often a snapshot, restore or clone in flight logs its bytes and files done, rate and time left")
	fs.DurationVar(&o.cfg.ShutdownGrace, "shutdown-grace", 25*time.Second, "how long calls in flight may finish after SIGTERM")
	fs.DurationVar(&o.cfg.MaxFreeze, "max-freeze", 10*time.Second, "how long an image volume's file system may stay frozen for a snapshot; a copy that takes longer (a pool that cannot share blocks) is thawed then and the snapshot refused")
	fs.Var(quantityFlag{&o.cfg.StandbyBandwidth}, "standby-bandwidth", "bytes a second the standby copies this node keeps may pull (a quantity, 100Mi; 0: unbounded)")
	fs.StringVar(&o.cfg.DefaultLayout, "default-layout", "directory", "the layout of a new mount volume whose StorageClass names none: directory (a directory in the pool, the reference driver's volume) or image (an ext4 of its own on a loop device, whose snapshots are one instant); a restore or clone takes its source's layout")
	fs.Var(quantityFlag{&o.cfg.JournalSize}, "journal-size", "for tests: the state journal's length (default 4Mi); a small one checkpoints every few changes")

	// The reference driver's other flags, so its manifests keep working.
	var attachLimit int64
	var mutableNames, blockType string
	enableListSnapshots := true
	var checkLifecycle, ephemeral bool
	fs.Int64Var(&attachLimit, "attach-limit", 0, "the reference's name for the node's volume limit: sets --maxvolumespernode")
	fs.BoolVar(&o.cfg.DisableControllerExpansion, "disable-controller-expansion", false, "do not offer ControllerExpandVolume; NodeExpandVolume grows volumes instead")
	fs.BoolVar(&o.cfg.DisableNodeExpansion, "disable-node-expansion", false, "do not offer NodeExpandVolume")
	fs.Var(quantityFlag{&o.cfg.MaxVolumeSizeNode}, "max-volume-size-node", "largest size NodeExpandVolume may grow a volume to (quantity; default --max-volume-size)")
	fs.StringVar(&mutableNames, "accepted-mutable-parameter-names", "", "comma-separated mutable parameter names ControllerModifyVolume accepts (default: all this driver supports)")
	fs.StringVar(&blockType, "snapshot-metadata-block-type", "VARIABLE_LENGTH", "SnapshotMetadata answers: VARIABLE_LENGTH ranges or FIXED_LENGTH 4 KiB blocks")
	fs.BoolVar(&enableListSnapshots, "enable-list-snapshots", true, "offer ListSnapshots")
	fs.BoolVar(&checkLifecycle, "check-volume-lifecycle", false, "accepted for compatibility: the lifecycle is always checked against the mount table")
	fs.BoolVar(&ephemeral, "ephemeral", false, "accepted for compatibility (deprecated there): inline ephemeral volumes are always served")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
			os.Exit(0)
		}
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (flags start with -)", fs.Arg(0))
	}
	if o.showVersion {
		return o, nil
	}
	switch o.mode {
	case "driver", "controller":
	case "transfer-signer":
		if o.signer.maxLifetime < 10*time.Minute {
			return o, fmt.Errorf("--transfer-max-cert-lifetime=%s: the CSR API signs for 10 minutes at least", o.signer.maxLifetime)
		}
		return o, nil // the driver's flags are not used
	default:
		return o, fmt.Errorf("--mode=%q: want driver, controller or transfer-signer", o.mode)
	}
	if transferAuthority != "signer" {
		return o, fmt.Errorf("--transfer-authority=%q: signer is the only mode (a shared Secret, in which any node could speak for any other, is not offered)", transferAuthority)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["check-volume-lifecycle"] {
		o.warnings = append(o.warnings, "--check-volume-lifecycle changes nothing here: every call is checked against the mount table")
	}
	if set["ephemeral"] {
		o.warnings = append(o.warnings, "--ephemeral changes nothing here: inline ephemeral volumes are always served, next to persistent ones")
	}
	if set["attach-limit"] {
		switch {
		case attachLimit < 0:
			return o, fmt.Errorf("--attach-limit=%d: must be 0 (no limit) or more", attachLimit)
		case set["maxvolumespernode"] && o.cfg.MaxVolumesPerNode != attachLimit:
			return o, fmt.Errorf("--attach-limit=%d and --maxvolumespernode=%d disagree: both set the node's volume limit here, give one", attachLimit, o.cfg.MaxVolumesPerNode)
		}
		o.cfg.MaxVolumesPerNode = attachLimit
	}
	if mutableNames != "" {
		for _, n := range strings.Split(mutableNames, ",") {
			if n = strings.TrimSpace(n); n != "" {
				o.cfg.AcceptedMutableParameters = append(o.cfg.AcceptedMutableParameters, n)
			}
		}
	}
	switch blockType {
	case "VARIABLE_LENGTH":
	case "FIXED_LENGTH":
		o.cfg.SnapshotMetadataFixedLength = true
	default:
		return o, fmt.Errorf("--snapshot-metadata-block-type=%q: want FIXED_LENGTH or VARIABLE_LENGTH", blockType)
	}
	o.cfg.DisableListSnapshots = !enableListSnapshots
	if o.cfg.MaxInlineSize < 0 {
		return o, errors.New("--max-inline-size must not be negative")
	}
	if o.cfg.MaxVolumeSizeNode < 0 {
		return o, errors.New("--max-volume-size-node must not be negative")
	}
	if len(capacity) > 0 {
		o.cfg.Capacity = capacity
	}
	if len(pools) > 0 {
		o.cfg.Pools = pools // checked by csi.New, before anything starts
	}
	for _, r := range localRoots {
		if !filepath.IsAbs(r) {
			return o, fmt.Errorf("--local-root %q must be an absolute path", r)
		}
	}
	o.cfg.LocalRoots = localRoots
	switch {
	case o.cfg.NodeID == "" && o.markPool == "" && o.mode != "controller":
		return o, errors.New("--nodeid is required: give the Kubernetes node name (for example --nodeid=$(hostname))")
	case o.cfg.StateDir == "":
		return o, errors.New("--statedir must not be empty")
	case o.cfg.MaxVolumesPerNode < 0:
		return o, fmt.Errorf("--maxvolumespernode=%d: must be 0 (no limit) or more", o.cfg.MaxVolumesPerNode)
	case o.cfg.MaxVolumeSize <= 0:
		return o, fmt.Errorf("--max-volume-size must be positive")
	case o.cfg.DriverName == "":
		return o, errors.New("--drivername must not be empty")
	}
	if _, err := csi.SocketPath(o.cfg.Endpoint); err != nil {
		return o, fmt.Errorf("--endpoint: %w", err)
	}
	if o.mode == "controller" {
		if o.cfg.NodeID != "" || o.pluginRegistrationPath != "" || len(pools) > 0 {
			return o, errors.New("--mode=controller serves no node: --nodeid, --plugin-registration-path and --pool are a node's driver's")
		}
		if _, port, err := net.SplitHostPort(o.controlEndpoint); err != nil || port == "" {
			return o, fmt.Errorf("--control-endpoint=%q: controller mode dials each node at this port (host:port, e.g. :9471)", o.controlEndpoint)
		}
	}
	if (o.pluginRegistrationPath == "") != (o.kubeletRegistrationPath == "") {
		return o, errors.New("--plugin-registration-path and --kubelet-registration-path go together: give both to register with kubelet, or neither to use the registrar sidecar")
	}
	if o.cfg.ShutdownGrace <= 0 {
		return o, errors.New("--shutdown-grace must be positive")
	}
	return o, nil
}
