// The floor of the scheduler-extender protocol, for scripts/bench_scheduling.py: an extender
// that does nothing an extender does not have to. Filter passes every node, prioritize scores
// every node 0, bind POSTs the pod's Binding (with its UID as a precondition, as ours does),
// preempt agrees with kube-scheduler's victims. What is left is what the protocol itself
// costs: JSON both ways and a round trip per verb. Benchmark tooling, not part of any
// deployment; built by the bench into a cache on first use.
//
// Only Go's standard library (no module proxy is reachable where the bench runs). So the
// kubeconfig is read by a line scanner that knows one cluster and one token user, the shape
// of the kubeconfig the bench writes for the extender's ServiceAccount; and the API server
// is spoken to as kube-scheduler's extender types define it (k8s.io/kube-scheduler
// extender/v1 types.go: Go structs without json tags, so PascalCase keys).
//
// GET /metrics serves each verb's handler time as the histogram ours serves
// (vmautoscale_extender_verb_duration_seconds, the bounds given by -buckets), so that the
// bench reads the floor's p50/p99 the way it reads ours.
//
//	floor-extender -kubeconfig PATH -listen 127.0.0.1:PORT [-buckets 0.001,0.01,...]
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// durations: per verb, a cumulative-bucket histogram of handler seconds.
type durations struct {
	mu     sync.Mutex
	bounds []float64
	counts map[string][]uint64 // per verb: one count per bound, then +Inf
	sums   map[string]float64
}

func (d *durations) timed(verb string, handler http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		handler(w, r)
		seconds := time.Since(start).Seconds()
		d.mu.Lock()
		defer d.mu.Unlock()
		counts := d.counts[verb]
		if counts == nil {
			counts = make([]uint64, len(d.bounds)+1)
			d.counts[verb] = counts
		}
		counts[sort.SearchFloat64s(d.bounds, seconds)]++
		d.sums[verb] += seconds
	}
}

func (d *durations) serve(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	const name = "vmautoscale_extender_verb_duration_seconds"
	var out strings.Builder
	for verb, counts := range d.counts {
		total := uint64(0)
		for i, bound := range d.bounds {
			total += counts[i]
			fmt.Fprintf(&out, "%s_bucket{le=\"%g\",verb=\"%s\"} %d\n", name, bound, verb, total)
		}
		total += counts[len(d.bounds)]
		fmt.Fprintf(&out, "%s_bucket{le=\"+Inf\",verb=\"%s\"} %d\n", name, verb, total)
		fmt.Fprintf(&out, "%s_count{verb=\"%s\"} %d\n", name, verb, total)
		fmt.Fprintf(&out, "%s_sum{verb=\"%s\"} %g\n", name, verb, d.sums[verb])
	}
	io.WriteString(w, out.String())
}

// kubeconfig: server, certificate-authority(-data) and token, each the first one in the file.
type kubeconfig struct{ server, caFile, caData, token string }

func readKubeconfig(path string) (kubeconfig, error) {
	var kc kubeconfig
	f, err := os.Open(path)
	if err != nil {
		return kc, err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for scanner.Scan() {
		key, value, ok := strings.Cut(strings.TrimLeft(scanner.Text(), " -"), ":")
		if !ok {
			continue
		}
		value = strings.Trim(strings.TrimSpace(value), `"'`)
		field := map[string]*string{
			"server": &kc.server, "certificate-authority": &kc.caFile,
			"certificate-authority-data": &kc.caData, "token": &kc.token,
		}[key]
		if field != nil && *field == "" {
			*field = value
		}
	}
	if kc.server == "" || kc.token == "" {
		return kc, fmt.Errorf("%s: no server or no token user", path)
	}
	return kc, scanner.Err()
}

func apiClient(kc kubeconfig) (*http.Client, error) {
	pool := x509.NewCertPool()
	pem := []byte{}
	switch {
	case kc.caData != "":
		decoded, err := base64.StdEncoding.DecodeString(kc.caData)
		if err != nil {
			return nil, err
		}
		pem = decoded
	case kc.caFile != "":
		read, err := os.ReadFile(kc.caFile)
		if err != nil {
			return nil, err
		}
		pem = read
	}
	if len(pem) > 0 && !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in the kubeconfig's certificate authority")
	}
	transport := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		// HTTP/2, as client-go speaks to the API server.
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
	}
	return &http.Client{Transport: transport}, nil
}

// Only what the floor reads of kube-scheduler's ExtenderArgs; the rest is scanned, not kept.
type extenderArgs struct {
	Pod struct {
		Metadata struct{ Name, Namespace, UID string } `json:"metadata"`
	}
	Nodes *struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
		} `json:"items"`
	}
	NodeNames *[]string
}

func (a *extenderArgs) names() []string {
	if a.NodeNames != nil {
		return *a.NodeNames
	}
	names := []string{}
	if a.Nodes != nil {
		for _, node := range a.Nodes.Items {
			names = append(names, node.Metadata.Name)
		}
	}
	return names
}

type floor struct {
	client *http.Client
	kc     kubeconfig
}

func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	if err := json.NewDecoder(r.Body).Decode(into); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func answer(w http.ResponseWriter, body any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(body); err != nil {
		log.Printf("answer: %v", err)
	}
}

func (f *floor) filter(w http.ResponseWriter, r *http.Request) {
	var args struct {
		extenderArgs
		Nodes json.RawMessage // handed back as it came: every node passes
	}
	if !decode(w, r, &args) {
		return
	}
	result := map[string]any{"FailedNodes": map[string]string{}, "Error": ""}
	if args.NodeNames != nil {
		result["NodeNames"] = args.NodeNames
	} else {
		result["Nodes"] = args.Nodes
	}
	answer(w, result)
}

func (f *floor) prioritize(w http.ResponseWriter, r *http.Request) {
	var args extenderArgs
	if !decode(w, r, &args) {
		return
	}
	type hostPriority struct {
		Host  string
		Score int64
	}
	scores := []hostPriority{}
	for _, name := range args.names() {
		scores = append(scores, hostPriority{Host: name})
	}
	answer(w, scores)
}

func (f *floor) bind(w http.ResponseWriter, r *http.Request) {
	var args struct{ PodName, PodNamespace, PodUID, Node string }
	if !decode(w, r, &args) {
		return
	}
	binding, _ := json.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Binding",
		"metadata":   map[string]string{"name": args.PodName, "namespace": args.PodNamespace, "uid": args.PodUID},
		"target":     map[string]string{"apiVersion": "v1", "kind": "Node", "name": args.Node},
	})
	path := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding",
		f.kc.server, url.PathEscape(args.PodNamespace), url.PathEscape(args.PodName))
	request, _ := http.NewRequest(http.MethodPost, path, bytes.NewReader(binding))
	request.Header.Set("Content-Type", "application/json")
	request.Header.Set("Authorization", "Bearer "+f.kc.token)
	message := ""
	response, err := f.client.Do(request)
	if err != nil {
		message = err.Error()
	} else {
		body, _ := io.ReadAll(response.Body)
		response.Body.Close()
		if response.StatusCode != http.StatusCreated {
			message = fmt.Sprintf("binding: %d %s", response.StatusCode, body)
		}
	}
	answer(w, map[string]string{"Error": message})
}

func (f *floor) preempt(w http.ResponseWriter, r *http.Request) {
	type metaVictims struct {
		Pods             []map[string]string
		NumPDBViolations int64
	}
	var args struct {
		NodeNameToVictims map[string]struct {
			Pods []struct {
				Metadata struct{ UID string } `json:"metadata"`
			}
			NumPDBViolations int64
		}
		NodeNameToMetaVictims map[string]metaVictims
	}
	if !decode(w, r, &args) {
		return
	}
	victims := args.NodeNameToMetaVictims
	if victims == nil {
		victims = map[string]metaVictims{}
		for node, v := range args.NodeNameToVictims {
			meta := metaVictims{NumPDBViolations: v.NumPDBViolations}
			for _, pod := range v.Pods {
				meta.Pods = append(meta.Pods, map[string]string{"UID": pod.Metadata.UID})
			}
			victims[node] = meta
		}
	}
	answer(w, map[string]any{"NodeNameToMetaVictims": victims})
}

func main() {
	kubeconfigPath := flag.String("kubeconfig", "", "kubeconfig with the API server and a token")
	listen := flag.String("listen", "127.0.0.1:10298", "address for kube-scheduler's calls")
	buckets := flag.String("buckets", "0.0001,0.00025,0.0005,0.001,0.0025,0.005,0.01,0.025,0.05,0.1,0.25,1,5",
		"upper bounds of the handler-time histogram's buckets, seconds, ascending")
	flag.Parse()
	d := &durations{counts: map[string][]uint64{}, sums: map[string]float64{}}
	for _, field := range strings.Split(*buckets, ",") {
		bound, err := strconv.ParseFloat(field, 64)
		if err != nil || (len(d.bounds) > 0 && bound <= d.bounds[len(d.bounds)-1]) {
			fmt.Fprintf(os.Stderr, "floor-extender: -buckets: %q is not an ascending number\n", field)
			os.Exit(2)
		}
		d.bounds = append(d.bounds, bound)
	}
	kc, err := readKubeconfig(*kubeconfigPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "floor-extender: %v\n", err)
		os.Exit(2)
	}
	client, err := apiClient(kc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "floor-extender: %v\n", err)
		os.Exit(2)
	}
	f := &floor{client: client, kc: kc}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", d.timed("filter", f.filter))
	mux.HandleFunc("POST /prioritize", d.timed("prioritize", f.prioritize))
	mux.HandleFunc("POST /bind", d.timed("bind", f.bind))
	mux.HandleFunc("POST /preempt", d.timed("preempt", f.preempt))
	mux.HandleFunc("GET /metrics", d.serve)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	if err := http.ListenAndServe(*listen, mux); err != nil {
		fmt.Fprintf(os.Stderr, "floor-extender: %v\n", err)
		os.Exit(1)
	}
}
