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
//! - `patch`: merge, JSON and strategic merge patches;
//! - `selectors`: label and field selectors;
//! - `auth`, `rbac`: bearer tokens to identities, RBAC from stored objects;
//! - `discovery`: `/version`, `/api`, `/apis` documents;
//! - `routes`: the pure path grammar (what a path names, query parameters);
//! - `handlers`: the verbs; `protobuf`: the protobuf bodies kubectl sends;
//!   `tls`: CA and serving certificate; `error`: `Status` errors.
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

mod auth;
mod discovery;
mod error;
mod handlers;
mod objects;
mod patch;
mod protobuf;
mod rbac;
mod resources;
mod routes;
mod selectors;
mod store;
mod tls;
mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use auth::{
    EXTRA_CREDENTIAL_ID, EXTRA_NODE_NAME, EXTRA_NODE_UID, EXTRA_POD_NAME, EXTRA_POD_UID, Identity,
};
pub use error::{ApiError, Error};
pub use handlers::MAX_BODY;
pub use resources::{RESOURCES, ResourceDef, Storage};
pub use store::{EventType, Store, StoredEvent, Write, Written};

use auth::Tokens;
use handlers::Shared;
use tls::ServerPki;

/// The token of the built-in administrator (`system:masters`, bypasses RBAC).
pub const ADMIN_TOKEN: &str = "lab-admin-token";

/// Namespaces every cluster starts with.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Entry point: `ApiServer::builder()`.
#[derive(Debug)]
pub struct ApiServer;

impl ApiServer {
    /// A builder with the admin token, RBAC off, a 10,000-event history and
    /// a random loopback port.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder {
            tokens: vec![(ADMIN_TOKEN.to_string(), Identity::admin())],
            rbac: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history: 10_000,
            bookmark_interval: Duration::from_secs(5),
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
    bookmark_interval: Duration,
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

    /// How many events the history keeps for watches and exact lists.
    pub fn history_window(mut self, events: usize) -> Self {
        self.history = events;
        self
    }

    /// How often watches get a BOOKMARK (default 5 s).
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// Binds, seeds the initial namespaces and serves until [`ApiServerHandle::shutdown`].
    pub async fn start(self) -> Result<ApiServerHandle, Error> {
        // kube-rs and this server both use aws-lc-rs; installing it as the process
        // default keeps any rustls user that relies on the default from panicking.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let pki = ServerPki::generate()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config()?);
        let listener = TcpListener::bind(self.listen).await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store::new(self.history));
        for ns in INITIAL_NAMESPACES {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": uuid::Uuid::new_v4().to_string(),
                             "creationTimestamp": objects::now(), "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {}, "status": {"phase": "Active"}});
            store
                .write(resources::idx::NAMESPACES, "", ns, |_| Ok(Write::Put(obj)))
                .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        }
        let tokens = Arc::new(Tokens::default());
        for (t, id) in self.tokens {
            tokens.insert(&t, id);
        }
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            store: store.clone(),
            tokens: tokens.clone(),
            rbac: self.rbac,
            addr,
            shutdown: shutdown.clone(),
            bookmark_interval: self.bookmark_interval,
        });
        let router = handlers::router(shared);
        let task = tokio::spawn(serve(listener, acceptor, router, shutdown.clone()));
        tracing::info!(%addr, rbac = self.rbac, "embedded apiserver listening");
        Ok(ApiServerHandle {
            addr,
            pki,
            store,
            tokens,
            shutdown,
            task,
        })
    }
}

async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    shutdown: CancellationToken,
) {
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
    drop(listener);
    // Watches end on the cancelled token; idle keep-alive connections close at
    // once; in-flight requests get a moment to finish before being dropped.
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
    conns.abort_all();
}

/// A running server.
#[derive(Debug)]
pub struct ApiServerHandle {
    addr: SocketAddr,
    pki: ServerPki,
    store: Arc<Store>,
    tokens: Arc<Tokens>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
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
    /// projected token would be: the Pod's ServiceAccount (default `default`),
    /// its name and UID, and its Node's name and UID (if the Node exists) in
    /// `extra`. Returns the new bearer token.
    pub fn token_for_pod(&self, namespace: &str, pod: &str) -> Result<String, Error> {
        let obj = self
            .store
            .get(resources::idx::PODS, namespace, pod)
            .ok_or_else(|| Error::UnknownPod(format!("{namespace}/{pod}")))?;
        let s = |p: &str| {
            obj.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let sa = match s("/spec/serviceAccountName") {
            n if n.is_empty() => "default".to_string(),
            n => n,
        };
        let node = s("/spec/nodeName");
        let node_uid = self
            .store
            .get(resources::idx::NODES, "", &node)
            .and_then(|n| {
                n.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let identity = Identity::service_account(namespace, &sa).bound_to_pod(
            pod,
            &s("/metadata/uid"),
            &node,
            &node_uid,
        );
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

    /// A token that completes when the server is asked to shut down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
