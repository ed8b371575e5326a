// Command loadgen is the declop benchmark's load generator (standard library only).
//
//	loadgen create -prefix obj- -count 1000           POST objects of ~size bytes
//	loadgen churn  -prefix obj- -count 1000 -rate 100 -duration 10s -seq-start 1
//	loadgen burst  -name obj-0 -count 100 -seq-start 1
//
// Every write records one CSV line on stdout: name,seq,t_send_ns,t_ack_ns,status.
// Updates are JSON merge patches that set the annotations bench/seq and bench/ts (wall-clock
// send time in ns); the operators under test log the bench/seq they read.
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

type result struct {
	name   string
	seq    int64
	send   int64
	ack    int64
	status int
}

var (
	server, caFile, certFile, keyFile, namespace, resource, apiVersion, kind string
	client                                                                   *http.Client
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen create|churn|burst [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	fs.StringVar(&server, "server", "", "apiserver URL")
	fs.StringVar(&caFile, "ca", "", "CA file")
	fs.StringVar(&certFile, "cert", "", "client cert")
	fs.StringVar(&keyFile, "key", "", "client key")
	fs.StringVar(&namespace, "namespace", "bench", "namespace")
	fs.StringVar(&resource, "resource", "api/v1|configmaps", "apiPrefix|plural, e.g. apis/bench.declop.dev/v1|widgets")
	fs.StringVar(&apiVersion, "api-version", "v1", "apiVersion of created objects")
	fs.StringVar(&kind, "kind", "ConfigMap", "kind of created objects")
	prefix := fs.String("prefix", "obj-", "object name prefix")
	name := fs.String("name", "", "object name (burst)")
	count := fs.Int("count", 1000, "objects (create, churn) or updates (burst)")
	size := fs.Int("size", 6000, "payload bytes per object (create)")
	concurrency := fs.Int("concurrency", 32, "requests in flight")
	rate := fs.Float64("rate", 100, "updates per second (churn)")
	duration := fs.Duration("duration", 10*time.Second, "churn duration")
	seqStart := fs.Int64("seq-start", 1, "first sequence number")
	_ = fs.Parse(os.Args[2:])
	client = newClient(*concurrency)
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	results := make(chan result, 4096)
	done := make(chan struct{})
	go func() {
		for r := range results {
			fmt.Fprintf(out, "%s,%d,%d,%d,%d\n", r.name, r.seq, r.send, r.ack, r.status)
		}
		close(done)
	}()
	switch mode {
	case "create":
		jobs := make(chan int)
		var wg sync.WaitGroup
		for w := 0; w < *concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					n := fmt.Sprintf("%s%d", *prefix, i)
					results <- do("POST", collection(), createBody(n, *size), "application/json", n, 0)
				}
			}()
		}
		for i := 0; i < *count; i++ {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
	case "churn":
		total := int(*rate * duration.Seconds())
		jobs := make(chan int, total)
		var wg sync.WaitGroup
		for w := 0; w < *concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					n := fmt.Sprintf("%s%d", *prefix, i%*count)
					seq := *seqStart + int64(i)
					results <- patch(n, seq)
				}
			}()
		}
		start := time.Now()
		// a slow apiserver must not stretch the window: stop scheduling at 1.2 x duration
		limit := start.Add(*duration * 6 / 5)
		for i := 0; i < total; i++ {
			due := start.Add(time.Duration(float64(i) / *rate * float64(time.Second)))
			if time.Now().After(limit) {
				break
			}
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			jobs <- i
		}
		close(jobs)
		wg.Wait()
	case "burst":
		for i := 0; i < *count; i++ {
			results <- patch(*name, *seqStart+int64(i))
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", mode)
		os.Exit(2)
	}
	close(results)
	<-done
}

func collection() string {
	var prefix, plural string
	for i := 0; i < len(resource); i++ {
		if resource[i] == '|' {
			prefix, plural = resource[:i], resource[i+1:]
		}
	}
	return fmt.Sprintf("%s/%s/namespaces/%s/%s", server, prefix, namespace, plural)
}

func patch(name string, seq int64) result {
	send := time.Now().UnixNano()
	body := fmt.Sprintf(`{"metadata":{"annotations":{"bench/seq":"%d","bench/ts":"%d"}}}`, seq, send)
	return doAt("PATCH", collection()+"/"+name, []byte(body), "application/merge-patch+json", name, seq, send)
}

func createBody(name string, size int) []byte {
	// ~size bytes of data in 6 keys, random hex (incompressible, like real config)
	data := map[string]string{}
	per := size / 6
	for k := 0; k < 6; k++ {
		b := make([]byte, per/2)
		_, _ = rand.Read(b)
		data[fmt.Sprintf("key-%d", k)] = hex.EncodeToString(b)
	}
	meta := map[string]any{"name": name, "labels": map[string]string{"app.kubernetes.io/part-of": "declop-bench"},
		"annotations": map[string]string{"bench/seq": "0"}}
	obj := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}
	if kind == "ConfigMap" {
		obj["data"] = data
	} else {
		obj["spec"] = map[string]any{"payload": data}
	}
	b, _ := json.Marshal(obj)
	return b
}

func do(method, url string, body []byte, ctype, name string, seq int64) result {
	return doAt(method, url, body, ctype, name, seq, time.Now().UnixNano())
}

func doAt(method, url string, body []byte, ctype, name string, seq, send int64) result {
	status := 0
	for attempt := 0; attempt < 5; attempt++ {
		req, _ := http.NewRequest(method, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", "bench-loadgen")
		resp, err := client.Do(req)
		if err != nil {
			status = -1
			time.Sleep(50 * time.Millisecond)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
		if status == 429 || status >= 500 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		break
	}
	return result{name, seq, send, time.Now().UnixNano(), status}
}

func newClient(conns int) *http.Client {
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(caFile)
	must(err)
	pool.AppendCertsFromPEM(ca)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	must(err)
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

var _ = strconv.Itoa
