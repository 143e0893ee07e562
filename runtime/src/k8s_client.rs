//! The agent's Kubernetes client configuration, loaded so that no failure
//! quotes a credential and none panics.
//!
//! Two faults of a kubeconfig do otherwise: its YAML parser's message shows
//! the document around the fault — a `token:` line included — and kube-rs
//! panics building the client when a static token is no valid HTTP header
//! value (a line break, a control character). The in-cluster
//! ServiceAccount's token file is read by kube-rs per request and refused
//! there with an error that names no token, so it needs neither guard.
//! The controller builds its client with the same two guards
//! (`controller::cli`).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use secrecy::ExposeSecret as _;

/// The client configuration: the kubeconfig at `kubeconfig`, or the
/// in-cluster ServiceAccount. The error is a sentence for the log, naming
/// what failed and never what the kubeconfig holds.
pub async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, String> {
    let Some(path) = kubeconfig else {
        return kube::Config::incluster().map_err(|e| e.to_string());
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| kubeconfig_error(path, e))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| kubeconfig_error(path, e))?;
    if let Some(token) = &config.auth_info.token
        && http::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret())).is_err()
    {
        return Err(format!(
            "the token of kubeconfig {} is not a valid HTTP header value \
             (it holds a line break or another control character)",
            path.display()
        ));
    }
    Ok(config)
}

/// [`config`], then the client.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    kube::Client::try_from(config(kubeconfig).await?).map_err(|e| e.to_string())
}

fn kubeconfig_error(path: &Path, e: KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => format!(
            "kubeconfig {} is not valid YAML (the parser's message is not shown: it \
             quotes the file, credentials included)",
            path.display()
        ),
        other => format!("kubeconfig {}: {other}", path.display()),
    }
}
