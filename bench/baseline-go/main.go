// Command baseline is the controller-runtime reference operator of the declop benchmark:
// a no-op reconciler that reads the object from the manager's cache, appends one line
// "<unix ns> <namespace>/<name> <bench/seq annotation>" to --out, and returns.
// It sleeps only when the object's bench/block annotation equals its bench/seq annotation
// (scenario e: one busy reconcile). Everything else is controller-runtime's defaults.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

type reconciler struct {
	client.Client
	newObj func() client.Object
	mu     sync.Mutex
	out    *os.File
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	now := time.Now().UnixNano()
	obj := r.newObj()
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.emit(now, req.Namespace, req.Name, "-")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	ann := obj.GetAnnotations()
	seq := ann["bench/seq"]
	if seq == "" {
		seq = "-"
	}
	r.emit(now, req.Namespace, req.Name, seq)
	if block := ann["bench/block"]; block != "" && block == ann["bench/seq"] {
		ms, _ := strconv.Atoi(ann["bench/block-ms"])
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	return ctrl.Result{}, nil
}

func (r *reconciler) emit(ns int64, namespace, name, seq string) {
	line := fmt.Sprintf("%d %s/%s %s\n", ns, namespace, name, seq)
	r.mu.Lock()
	_, _ = r.out.WriteString(line)
	r.mu.Unlock()
}

func main() {
	namespace := flag.String("namespace", "", "namespace to watch")
	outPath := flag.String("out", "", "reconcile log file")
	gvk := flag.String("gvk", "", "group/version/Kind of a custom resource (default: ConfigMaps)")
	userAgent := flag.String("user-agent", "bench-controller-runtime", "User-Agent")
	flag.Parse()

	log.SetLogger(zap.New(zap.UseDevMode(false)))
	// --kubeconfig is controller-runtime's own flag (pkg/client/config)
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg.UserAgent = *userAgent
	// BENCH_CR_CONTENT_TYPE=json: talk JSON to the apiserver for built-in kinds too, as declop
	// does (controller-runtime asks for protobuf when its scheme knows the kind), so the two
	// operators' lists cost the apiserver the same encoding.
	if os.Getenv("BENCH_CR_CONTENT_TYPE") == "json" {
		cfg.ContentType = "application/json"
		cfg.AcceptContentTypes = "application/json"
	}
	out, err := os.OpenFile(*outPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{*namespace: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		// The CRD variant reconciles unstructured objects, which controller-runtime's client
		// reads from the apiserver unless told to cache them: read them from the cache, like
		// typed objects (and like declop and the benchmark's premise of cache-backed reads).
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	newObj := func() client.Object { return &corev1.ConfigMap{} }
	if *gvk != "" {
		gv, kind := schema.ParseKindArg(*gvk)
		if gv == nil {
			fmt.Fprintln(os.Stderr, "--gvk must be Kind.version.group")
			os.Exit(1)
		}
		g := *gv
		newObj = func() client.Object {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(g)
			return u
		}
		_ = kind
	}
	r := &reconciler{Client: mgr.GetClient(), newObj: newObj, out: out}
	if err := ctrl.NewControllerManagedBy(mgr).Named("bench").For(newObj()).Complete(r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
