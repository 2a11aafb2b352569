// Command kube-apiserver-etcd runs an embedded single-member etcd on loopback and then the
// Kubernetes API server against it, in one process, so the test bed needs no etcd binary.
//
// Usage:
//
//	kube-apiserver-etcd --etcd-data-dir=DIR --etcd-client-port=N --etcd-peer-port=M -- APISERVER-FLAGS...
//
// The API server stops first (on SIGTERM it shuts down gracefully), then etcd is stopped: an API
// server whose etcd vanished underneath it hangs instead of exiting.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	ours, apiserverArgs := splitArgs(os.Args[1:])

	flags := flag.NewFlagSet("kube-apiserver-etcd", flag.ExitOnError)
	dataDir := flags.String("etcd-data-dir", "", "etcd data directory (required)")
	clientPort := flags.Int("etcd-client-port", 2379, "etcd client port on 127.0.0.1")
	peerPort := flags.Int("etcd-peer-port", 2380, "etcd peer port on 127.0.0.1")
	noFsync := flags.Bool("etcd-unsafe-no-fsync", true, "skip fsync in etcd (a throwaway test cluster)")
	logLevel := flags.String("etcd-log-level", "warn", "etcd log level")
	_ = flags.Parse(ours)
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "kube-apiserver-etcd: --etcd-data-dir is required")
		os.Exit(2)
	}

	etcd, err := startEtcd(*dataDir, *clientPort, *peerPort, *noFsync, *logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-apiserver-etcd: etcd: %v\n", err)
		os.Exit(1)
	}

	command := app.NewAPIServerCommand()
	command.SetArgs(append(apiserverArgs, fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", *clientPort)))
	code := cli.Run(command)

	fmt.Fprintln(os.Stderr, "kube-apiserver-etcd: API server stopped; stopping etcd")
	stopEtcd(etcd, 5*time.Second)
	os.Exit(code)
}

// stopEtcd stops the etcd server (raft and storage flushed). A full Close would wait for the
// API server's etcd client streams, which nothing closes, so the process exits right after.
func stopEtcd(etcd *embed.Etcd, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		etcd.Server.Stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		fmt.Fprintf(os.Stderr, "kube-apiserver-etcd: etcd did not stop within %s\n", timeout)
	}
}

// splitArgs separates our flags (before "--") from the API server's (after it).
func splitArgs(args []string) ([]string, []string) {
	for i, arg := range args {
		if arg == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}

func startEtcd(dataDir string, clientPort, peerPort int, noFsync bool, logLevel string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "testbed"
	cfg.Dir = dataDir
	cfg.LogLevel = logLevel
	cfg.UnsafeNoFsync = noFsync
	// Without these etcd logs every request as slow (the embed defaults are zero).
	cfg.WarningUnaryRequestDuration = time.Second
	cfg.WarningApplyDuration = time.Second
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-etcd.Server.ReadyNotify():
		return etcd, nil
	case err := <-etcd.Err():
		etcd.Close()
		return nil, err
	case <-time.After(60 * time.Second):
		etcd.Close()
		return nil, fmt.Errorf("not ready after 60s")
	}
}
