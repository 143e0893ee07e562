//! An embedded Kubernetes API server for the lab and the integration tests.
//!
//! It speaks the real protocol over HTTPS so that the real `kube` client
//! paths (discovery, CRUD, patches, watches with bookmarks, 410 recovery) and
//! `kubectl` run against it. It keeps objects as JSON in memory; see
//! `docs/embedded-apiserver.md` for what is implemented and what is refused.
//!
//! # Layout
//!
//! - `resources`: the table of served kinds;
//! - `store`: objects, the global resourceVersion, event history, broadcast;
//! - `watch`: per-watch filtering, bookmarks, timeouts;
//! - `objects`: create/update/delete semantics (metadata, status, finalizers,
//!   CSR rules);
//! - `validation`: what kube-apiserver checks before it stores an object
//!   (field types, names, labels, ConfigMap/Secret/CSR/Lease rules);
//! - `patch`: merge, JSON and strategic merge patches;
//! - `selectors`: label and field selectors;
//! - `auth`, `rbac`: bearer tokens to identities, RBAC from stored objects;
//! - `serviceaccount`: TokenRequest (`serviceaccounts/<name>/token`) and the
//!   Pod-bound identity it shares with [`ApiServerHandle::token_for_pod`];
//! - `discovery`: `/version`, `/api`, `/apis` documents;
//! - [`kube_ovn`]: a Kube-OVN-shaped cluster on this server (RBAC, the CNI
//!   DaemonSet, Nodes, CNI Pods with Pod-bound tokens) and the DaemonSet
//!   controller's and kubelet's part in a rollout;
//! - `routes`: the pure path grammar (what a path names, query parameters);
//! - `handlers`: the verbs; `protobuf`: the protobuf bodies kubectl sends;
//!   `tls`: CA and serving certificate; `error`: `Status` errors;
//! - [`faults`]: errors and dropped watches a test drives in.
//!
//! ```no_run
//! # async fn demo() -> Result<(), apiserver::Error> {
//! use apiserver::{ApiServer, Identity};
//! let server = ApiServer::builder()
//!     .token("cni", Identity::service_account("kube-system", "kube-ovn-cni"))
//!     .rbac(true)
//!     .start()
//!     .await?;
//! let admin = server.client(apiserver::ADMIN_TOKEN).await?;
//! let cni = server.client("cni").await?;
//! # let _ = (admin, cni);
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! [`ApiServerHandle::restart_with_empty_store`] models an API server that
//! comes back with its store reset (an etcd restored from an old backup):
//! same address, CA, serving certificate and tokens, a store starting over
//! from resourceVersion 1; [`ApiServerHandle::reset_store`] does the same
//! under open connections, as a watch cache re-initialised over a restored
//! etcd. How a watch from a version the new store never issued is answered
//! is [`FutureWatch`].

mod auth;
pub mod chart;
mod discovery;
mod error;
pub mod faults;
mod handlers;
pub mod kube_ovn;
mod objects;
mod patch;
mod protobuf;
mod rbac;
mod resources;
mod routes;
mod selectors;
mod serviceaccount;
mod store;
mod tls;
mod validation;
mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use kube_ovn_ipsec_api::clock::{Clock, SystemClock};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use serviceaccount::{API_AUDIENCE, DEFAULT_EXPIRATION_SECONDS};

pub use auth::{
    EXTRA_CREDENTIAL_ID, EXTRA_NODE_NAME, EXTRA_NODE_UID, EXTRA_POD_NAME, EXTRA_POD_UID, Identity,
};
pub use error::{ApiError, Error};
pub use handlers::MAX_BODY;
pub use resources::{RESOURCES, ResourceDef, Storage};
pub use store::{
    DEFAULT_HISTORY_BYTES, EventType, Store, StoredEvent, Write, Written, event_bytes,
};

use auth::Tokens;
use handlers::{Current, Shared};
use tls::ServerPki;

/// The token of the built-in administrator (`system:masters`, bypasses RBAC).
pub const ADMIN_TOKEN: &str = "lab-admin-token";

/// Namespaces every cluster starts with.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// How a watch from a resourceVersion newer than any the store has issued is
/// answered. On one server every version a client holds came from it, so such
/// a version is only ever seen after the store was reset
/// ([`ApiServerHandle::restart_with_empty_store`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FutureWatch {
    /// 200 with one `ERROR` event, a `Status` of code 410, reason `Expired`:
    /// what a kube-apiserver on an etcd restored with `--bump-revision
    /// --mark-compacted` answers for a version from before the restore. kube-rs'
    /// `watcher` and client-go's reflector relist on it.
    #[default]
    Expire,
    /// Accept the watch and wait until the store reaches that version, as
    /// kube-apiserver's watch cache does for a version ahead of it (after a
    /// restore without a revision bump, the watch silently misses everything
    /// up to it). For testing clients that must not rely on a 410.
    Wait,
}

/// Entry point: `ApiServer::builder()`.
#[derive(Debug)]
pub struct ApiServer;

impl ApiServer {
    /// A builder with the admin token, RBAC off, a history of 10,000 events
    /// within [`DEFAULT_HISTORY_BYTES`] and a random loopback port.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder {
            tokens: vec![(ADMIN_TOKEN.to_string(), Identity::admin())],
            rbac: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history: 10_000,
            history_bytes: DEFAULT_HISTORY_BYTES,
            bookmark_interval: Duration::from_secs(5),
            future_watch: FutureWatch::default(),
            clock: Arc::new(SystemClock),
            faults: Arc::default(),
        }
    }
}

/// Configures and starts a server.
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    tokens: Vec<(String, Identity)>,
    rbac: bool,
    listen: SocketAddr,
    history: usize,
    history_bytes: usize,
    bookmark_interval: Duration,
    future_watch: FutureWatch,
    clock: Arc<dyn Clock>,
    faults: Arc<faults::Faults>,
}

/// What a restart keeps besides the listener, the PKI and the tokens.
#[derive(Debug, Clone)]
struct Settings {
    rbac: bool,
    history: usize,
    history_bytes: usize,
    bookmark_interval: Duration,
    future_watch: FutureWatch,
    clock: Arc<dyn Clock>,
    faults: Arc<faults::Faults>,
}

impl ApiServerBuilder {
    /// Accept `token` as a bearer token for `identity`.
    pub fn token(mut self, token: &str, identity: Identity) -> Self {
        self.tokens.push((token.to_string(), identity));
        self
    }

    /// Enforce RBAC from the Role/Binding objects in the store.
    pub fn rbac(mut self, on: bool) -> Self {
        self.rbac = on;
        self
    }

    /// Listening address (default 127.0.0.1:0).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// How many events the history keeps for watches and exact lists
    /// (default 10,000).
    pub fn history_window(mut self, events: usize) -> Self {
        self.history = events;
        self
    }

    /// How many bytes of events the history keeps, as
    /// [`event_bytes`] counts them (default
    /// [`DEFAULT_HISTORY_BYTES`]). Whichever of this and
    /// [`Self::history_window`] is reached first evicts the oldest events;
    /// a watch or exact list from an evicted resourceVersion gets 410 Expired.
    pub fn history_bytes(mut self, bytes: usize) -> Self {
        self.history_bytes = bytes;
        self
    }

    /// How often watches get a BOOKMARK (default 5 s).
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// How a watch from a resourceVersion the store has not issued is
    /// answered (default [`FutureWatch::Expire`]).
    pub fn future_watch(mut self, answer: FutureWatch) -> Self {
        self.future_watch = answer;
        self
    }

    /// The wall clock token issuance and expiry read (default: the system
    /// clock). Tests move a clock of their own to expire tokens, which
    /// cannot be asked for less than ten minutes.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The fault switch a test drives ([`faults::Faults`]; default: one that
    /// never fires).
    pub fn faults(mut self, faults: Arc<faults::Faults>) -> Self {
        self.faults = faults;
        self
    }

    /// Binds, seeds the initial namespaces and serves until [`ApiServerHandle::shutdown`].
    pub async fn start(self) -> Result<ApiServerHandle, Error> {
        // kube-rs and this server both use aws-lc-rs; installing it as the process
        // default keeps any rustls user that relies on the default from panicking.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let pki = ServerPki::generate()?;
        let tls = pki.server_config()?;
        let listener = TcpListener::bind(self.listen).await?;
        let addr = listener.local_addr()?;
        let tokens = Arc::new(Tokens::default());
        for (t, id) in self.tokens {
            tokens.insert(&t, id);
        }
        let settings = Settings {
            rbac: self.rbac,
            history: self.history,
            history_bytes: self.history_bytes,
            bookmark_interval: self.bookmark_interval,
            future_watch: self.future_watch,
            clock: self.clock,
            faults: self.faults,
        };
        let running = launch(
            listener,
            addr,
            tls.clone(),
            tokens.clone(),
            settings.clone(),
        )?;
        Ok(ApiServerHandle {
            addr,
            pki,
            tls,
            settings,
            tokens,
            current: running.current,
            store: running.store,
            shutdown: running.shutdown,
            keep_listener: running.keep_listener,
            task: running.task,
        })
    }
}

/// One serving run: a fresh store behind a listener.
struct Running {
    current: Arc<Current>,
    store: Arc<Store>,
    shutdown: CancellationToken,
    keep_listener: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Option<TcpListener>>,
}

/// Seeds a new store with the initial namespaces and serves it on `listener`.
fn launch(
    listener: TcpListener,
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    tokens: Arc<Tokens>,
    settings: Settings,
) -> Result<Running, Error> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let store = seeded_store(&settings)?;
    let shutdown = CancellationToken::new();
    let keep_listener = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared {
        store: store.clone(),
        tokens,
        rbac: settings.rbac,
        addr,
        // A child: a store reset ends the watches, not the server.
        shutdown: shutdown.child_token(),
        bookmark_interval: settings.bookmark_interval,
        future_watch: settings.future_watch,
        clock: settings.clock.clone(),
        faults: settings.faults.clone(),
    });
    let current = Arc::new(Current::new(shared));
    let router = handlers::router(current.clone());
    let task = tokio::spawn(serve(
        listener,
        acceptor,
        router,
        shutdown.clone(),
        keep_listener.clone(),
    ));
    tracing::info!(%addr, rbac = settings.rbac, "embedded apiserver listening");
    Ok(Running {
        current,
        store,
        shutdown,
        keep_listener,
        task,
    })
}

/// A new store holding the initial namespaces.
fn seeded_store(settings: &Settings) -> Result<Arc<Store>, Error> {
    let store = Arc::new(Store::with_history(
        settings.history,
        settings.history_bytes,
    ));
    for ns in INITIAL_NAMESPACES {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": uuid::Uuid::new_v4().to_string(),
                             "creationTimestamp": objects::now(), "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {}, "status": {"phase": "Active"}});
        store
            .write(resources::idx::NAMESPACES, "", ns, |_| Ok(Write::Put(obj)))
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    }
    Ok(store)
}

/// Serves until `shutdown`; hands the listener back if `keep_listener` was
/// set by then (a restart), otherwise closes it at once so that new
/// connections are refused while the open ones wind down.
async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    shutdown: CancellationToken,
    keep_listener: Arc<AtomicBool>,
) -> Option<TcpListener> {
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                let watcher = graceful.watcher();
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .into_owned();
                    let _ = watcher.watch(conn).await;
                });
            }
        }
    }
    // Across a restart the listener stays open: a client connecting meanwhile
    // waits in the backlog for the next run instead of being refused.
    let kept = keep_listener.load(Ordering::SeqCst).then_some(listener);
    // Watches end on the cancelled token; idle keep-alive connections close at
    // once; in-flight requests get a moment to finish before being dropped.
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
    conns.abort_all();
    kept
}

/// A running server.
#[derive(Debug)]
pub struct ApiServerHandle {
    addr: SocketAddr,
    pki: ServerPki,
    tls: Arc<rustls::ServerConfig>,
    settings: Settings,
    current: Arc<Current>,
    store: Arc<Store>,
    tokens: Arc<Tokens>,
    shutdown: CancellationToken,
    keep_listener: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Option<TcpListener>>,
}

impl ApiServerHandle {
    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// The store, for tests (inspect objects, force compaction with [`Store::compact`]).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Accepts another bearer token from now on.
    pub fn add_token(&self, token: &str, identity: Identity) {
        self.tokens.insert(token, identity);
    }

    /// Issues a ServiceAccount token bound to a stored Pod, as the kubelet's
    /// projected token would be: the Pod's ServiceAccount (default `default`;
    /// its UID when the ServiceAccount is stored), its name and UID, and its
    /// Node's name and UID (if the Node exists) in `extra`. Returns the new
    /// bearer token. Unlike one from a TokenRequest it does not expire, needs
    /// no stored ServiceAccount, and outlives the Pod.
    pub fn token_for_pod(&self, namespace: &str, pod: &str) -> Result<String, Error> {
        let obj = self
            .store
            .get(resources::idx::PODS, namespace, pod)
            .ok_or_else(|| Error::UnknownPod(format!("{namespace}/{pod}")))?;
        let (identity, _) = serviceaccount::pod_bound_identity(&self.store, namespace, &obj);
        let token = format!("pod-{}", uuid::Uuid::new_v4());
        self.tokens.insert(&token, identity);
        Ok(token)
    }

    /// Stops accepting a token.
    pub fn remove_token(&self, token: &str) {
        self.tokens.remove(token);
    }

    /// A kubeconfig (JSON, which is YAML) for `token`, with the CA inline.
    pub fn kubeconfig_yaml(&self, token: &str) -> Result<String, Error> {
        if !self.tokens.contains(token) {
            return Err(Error::UnknownToken(token.to_string()));
        }
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.pki.ca_pem.as_bytes());
        let doc: Value = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "lab", "cluster": {"server": self.url(), "certificate-authority-data": ca}}],
            "users": [{"name": "lab-user", "user": {"token": token}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab-user", "namespace": "default"}}],
            "current-context": "lab",
            "preferences": {},
        });
        serde_json::to_string_pretty(&doc).map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// Writes [`Self::kubeconfig_yaml`] to a file (for kubectl: `--kubeconfig FILE`).
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig_yaml(token)?)?;
        Ok(())
    }

    /// A kube-rs `Config` for `token`, built through kube's own kubeconfig loader.
    pub async fn kube_config(&self, token: &str) -> Result<kube::Config, Error> {
        let text = self.kubeconfig_yaml(token)?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// A kube-rs client authenticated with `token`.
    pub async fn client(&self, token: &str) -> Result<kube::Client, Error> {
        Ok(kube::Client::try_from(self.kube_config(token).await?)?)
    }

    /// Stops accepting, ends watches, and waits (briefly) for connections to close.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Resets the store under the running server, as a kube-apiserver whose
    /// etcd was restored underneath it re-initialises its watch cache: every
    /// open watch ends (cleanly, no error), connections stay open, and
    /// requests from now on see a new store holding only the initial
    /// namespaces, its resourceVersions starting over below the ones clients
    /// hold. A watch resumed from an old version is answered as
    /// [`FutureWatch`] says. [`Self::store`] is the new store afterwards.
    pub fn reset_store(&mut self) -> Result<(), Error> {
        let store = seeded_store(&self.settings)?;
        let old = self.current.get();
        let shared = Arc::new(Shared {
            store: store.clone(),
            tokens: old.tokens.clone(),
            rbac: old.rbac,
            addr: old.addr,
            shutdown: self.shutdown.child_token(),
            bookmark_interval: old.bookmark_interval,
            future_watch: old.future_watch,
            clock: old.clock.clone(),
            faults: old.faults.clone(),
        });
        // New requests (the re-watches among them) reach the new store
        // before the old watches are told to end.
        self.current.replace(shared);
        old.shutdown.cancel();
        self.store = store;
        Ok(())
    }

    /// Restarts the server with its store reset, as an API server whose etcd
    /// was restored from an old backup: open watches end and connections
    /// close, then the same address, CA, serving certificate, tokens and
    /// settings serve a new store holding only the initial namespaces, its
    /// resourceVersions starting over (below the ones clients hold). A watch
    /// resumed from an old version is answered as [`FutureWatch`] says.
    /// [`Self::store`] and [`Self::shutdown_token`] refer to the new run
    /// afterwards.
    pub async fn restart_with_empty_store(&mut self) -> Result<(), Error> {
        self.keep_listener.store(true, Ordering::SeqCst);
        self.shutdown.cancel();
        let listener = match (&mut self.task).await {
            Ok(Some(listener)) => listener,
            // The serving task died: bind the address again.
            Ok(None) | Err(_) => TcpListener::bind(self.addr).await?,
        };
        let running = launch(
            listener,
            self.addr,
            self.tls.clone(),
            self.tokens.clone(),
            self.settings.clone(),
        )?;
        self.current = running.current;
        self.store = running.store;
        self.shutdown = running.shutdown;
        self.keep_listener = running.keep_listener;
        self.task = running.task;
        Ok(())
    }

    /// A token that completes when the server is asked to shut down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
