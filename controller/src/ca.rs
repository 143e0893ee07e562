//! The built-in CA's Kubernetes objects: Secret `ovn-ipsec-ca` and the trust
//! bundle ConfigMap `ovn-ipsec-trust`, and the two rotation operations.
//!
//! Invariant: the active CA (the one in the Secret) is always in the bundle.
//! Rotation therefore adds the new CA to the bundle *before* it becomes the
//! active signer, and an old CA leaves the bundle only through the explicit
//! [`retire_old_cas`] step, which refuses unless the operator names the
//! bundle digest every node has acknowledged (docs/controller.md).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use kube_ovn_ipsec_api::clock::Clock;
use kube_ovn_ipsec_api::conflict::replace_on_conflict;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};

use crate::error::{Error, Result};
use crate::signer::{CaKeyAlgorithm, CertificateAuthority};
use crate::{names, secret};

/// An `api` PKI error as the controller reports a bad trust bundle.
fn bundle_error(e: kube_ovn_ipsec_api::Error) -> Error {
    Error::TrustBundleInvalid(e.to_string())
}

/// How many times a write of the trust bundle is tried against concurrent
/// writers (another replica, an operator edit) before giving up.
const BUNDLE_WRITE_ATTEMPTS: u32 = 5;

/// Every write of the trust bundle lost to a concurrent writer.
fn bundle_kept_changing(_last: Error) -> Error {
    Error::TrustBundleInvalid("trust bundle kept changing under concurrent writes".into())
}

/// Which CA the controller signs with, and where its objects live.
#[derive(Clone, Debug)]
pub struct CaSettings {
    /// The controller's namespace.
    pub namespace: String,
    /// Key algorithm for a newly generated CA.
    pub algorithm: CaKeyAlgorithm,
    /// Lifetime of a newly generated CA.
    pub lifetime: Duration,
}

/// Loads the CA from its Secret, generating and storing one if absent, and
/// makes sure the trust bundle holds it. Safe to run from several replicas:
/// a lost create race re-reads the winner's CA.
pub async fn ensure_ca(
    client: &Client,
    settings: &CaSettings,
    clock: &dyn Clock,
) -> Result<(CertificateAuthority, TrustBundle)> {
    // The CA Secret is never read or written through `Api<Secret>`: see
    // `secret` for why.
    let ns = &settings.namespace;
    let ca = match secret::get_opt(client, ns, names::CA_SECRET).await? {
        Some(found) => ca_from_secret(ns, &found)?,
        None => {
            let ca =
                CertificateAuthority::generate(settings.algorithm, settings.lifetime, clock.now())?;
            match secret::create(client, ns, &ca_secret(ns, &ca)).await {
                Ok(()) => {
                    tracing::info!(namespace = %ns, "generated the IPsec CA");
                    ca
                }
                Err(e) if e.is_conflict() => {
                    ca_from_secret(ns, &secret::get(client, ns, names::CA_SECRET).await?)?
                }
                Err(e) => return Err(e),
            }
        }
    };
    let bundle = ensure_in_bundle(client, &settings.namespace, ca.certificate()).await?;
    Ok((ca, bundle))
}

/// Generates a new CA, adds it to the bundle, then makes it the active signer.
/// Returns the new bundle (old and new CA). Leaves issued from now on chain to
/// the new CA; nodes renew onto it on their normal schedule (or sooner, see
/// docs/controller.md).
pub async fn rotate_ca(
    client: &Client,
    settings: &CaSettings,
    clock: &dyn Clock,
) -> Result<TrustBundle> {
    let ns = &settings.namespace;
    let mut current = secret::get(client, ns, names::CA_SECRET).await?;
    let new = CertificateAuthority::generate(settings.algorithm, settings.lifetime, clock.now())?;
    // Bundle first: a leaf from the new CA must never reach a node whose
    // bundle cannot verify it.
    let bundle = ensure_in_bundle(client, &settings.namespace, new.certificate()).await?;
    current.data = ca_secret(ns, &new).data;
    // resourceVersion from the read: a concurrent rotation fails instead of
    // silently replacing the other's CA.
    secret::replace(client, ns, names::CA_SECRET, &current).await?;
    tracing::info!(trust_digest = %bundle.digest(), "rotated the IPsec CA");
    Ok(bundle)
}

/// Removes every CA but the active one from the bundle, only if the bundle's
/// current digest is `acknowledged_digest` (what every node reports as its
/// acknowledged trust digest).
pub async fn retire_old_cas(
    client: &Client,
    namespace: &str,
    acknowledged_digest: &str,
) -> Result<TrustBundle> {
    let active = ca_from_secret(
        namespace,
        &secret::get(client, namespace, names::CA_SECRET).await?,
    )?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut cm = maps.get(names::TRUST_CONFIGMAP).await?;
    let bundle = bundle_from_configmap(&cm)?;
    let retired = plan_retire(&bundle, active.cert_der(), acknowledged_digest)?;
    write_bundle(&mut cm, &retired);
    maps.replace(names::TRUST_CONFIGMAP, &PostParams::default(), &cm)
        .await?;
    tracing::info!(trust_digest = %retired.digest(), "retired old IPsec CAs");
    Ok(retired)
}

/// The pure decision behind [`retire_old_cas`].
pub fn plan_retire(
    bundle: &TrustBundle,
    active_der: &[u8],
    acknowledged_digest: &str,
) -> Result<TrustBundle> {
    let digest = bundle.digest().to_hex();
    if !digest.eq_ignore_ascii_case(acknowledged_digest.trim()) {
        return Err(Error::RotationRefused(format!(
            "the bundle's digest is {digest}, not the acknowledged {acknowledged_digest}: \
             nodes have not acknowledged the current bundle"
        )));
    }
    if !bundle.contains(active_der) {
        return Err(Error::RotationRefused(
            "the active CA is not in the bundle".into(),
        ));
    }
    if bundle.certificates().len() < 2 {
        return Err(Error::RotationRefused(
            "the bundle holds only the active CA".into(),
        ));
    }
    bundle.retain_only(active_der).map_err(bundle_error)
}

/// Marks `ca` as the CA this controller signs with, on the trust bundle
/// ConfigMap ([`names::SIGNING_CA_ANNOTATION`]), once it does: nodes whose
/// leaves predate it renew onto it (docs/controller.md, "CA rotation").
/// Called after the signer is in place, never before, so a node renewing on
/// the mark gets a leaf from this CA. No write when the mark is current.
pub async fn announce_signing_ca(client: &Client, namespace: &str, ca: &Certificate) -> Result<()> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let fingerprint = ca.digest().to_hex();
    let announced = replace_on_conflict(BUNDLE_WRITE_ATTEMPTS, Error::is_conflict, || {
        mark_signing_ca(&maps, &fingerprint)
    })
    .await
    .map_err(|e| e.or_exhausted(bundle_kept_changing))?;
    if announced {
        tracing::info!(signing_ca = %fingerprint, "announced the signing CA to the nodes");
    }
    Ok(())
}

/// One read-modify-replace of [`announce_signing_ca`]: whether it wrote
/// (`false`: the mark was already `fingerprint`).
async fn mark_signing_ca(maps: &Api<ConfigMap>, fingerprint: &str) -> Result<bool> {
    let mut cm = maps.get(names::TRUST_CONFIGMAP).await?;
    let annotations = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if annotations
        .get(names::SIGNING_CA_ANNOTATION)
        .is_some_and(|mark| mark == fingerprint)
    {
        return Ok(false);
    }
    annotations.insert(names::SIGNING_CA_ANNOTATION.into(), fingerprint.to_owned());
    maps.replace(names::TRUST_CONFIGMAP, &PostParams::default(), &cm)
        .await?;
    Ok(true)
}

/// Reads the trust bundle ConfigMap (cert-manager mode: provided by the operator).
pub async fn read_bundle(client: &Client, namespace: &str) -> Result<TrustBundle> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match maps.get_opt(names::TRUST_CONFIGMAP).await? {
        Some(cm) => bundle_from_configmap(&cm),
        None => Err(Error::TrustBundleInvalid(format!(
            "ConfigMap {namespace}/{} does not exist",
            names::TRUST_CONFIGMAP
        ))),
    }
}

async fn ensure_in_bundle(
    client: &Client,
    namespace: &str,
    ca: &Certificate,
) -> Result<TrustBundle> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    replace_on_conflict(BUNDLE_WRITE_ATTEMPTS, Error::is_conflict, || {
        add_to_bundle(&maps, namespace, ca)
    })
    .await
    .map_err(|e| e.or_exhausted(bundle_kept_changing))
}

/// One read-modify-write of [`ensure_in_bundle`]: the bundle ConfigMap
/// created with `ca` alone, or `ca` added to it (no write when it is
/// already in).
async fn add_to_bundle(
    maps: &Api<ConfigMap>,
    namespace: &str,
    ca: &Certificate,
) -> Result<TrustBundle> {
    let Some(mut cm) = maps.get_opt(names::TRUST_CONFIGMAP).await? else {
        let bundle = TrustBundle::from_certificates(vec![ca.clone()]).map_err(bundle_error)?;
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(names::TRUST_CONFIGMAP.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        write_bundle(&mut cm, &bundle);
        maps.create(&PostParams::default(), &cm).await?;
        return Ok(bundle);
    };
    let mut bundle = bundle_from_configmap(&cm)?;
    if !bundle.add(ca.clone()).map_err(bundle_error)? {
        return Ok(bundle);
    }
    write_bundle(&mut cm, &bundle);
    maps.replace(names::TRUST_CONFIGMAP, &PostParams::default(), &cm)
        .await?;
    Ok(bundle)
}

fn bundle_from_configmap(cm: &ConfigMap) -> Result<TrustBundle> {
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(names::TRUST_CONFIGMAP_KEY))
        .ok_or_else(|| {
            Error::TrustBundleInvalid(format!("key {} missing", names::TRUST_CONFIGMAP_KEY))
        })?;
    TrustBundle::from_pem(pem.as_bytes()).map_err(bundle_error)
}

fn write_bundle(cm: &mut ConfigMap, bundle: &TrustBundle) {
    cm.data
        .get_or_insert_with(BTreeMap::new)
        .insert(names::TRUST_CONFIGMAP_KEY.into(), bundle.to_pem());
    cm.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            names::TRUST_DIGEST_ANNOTATION.into(),
            bundle.digest().to_hex(),
        );
}

fn ca_secret(namespace: &str, ca: &CertificateAuthority) -> Secret {
    let data = BTreeMap::from([
        (
            names::CA_SECRET_CERT_KEY.to_owned(),
            ByteString(ca.cert_pem().into_bytes()),
        ),
        (
            names::CA_SECRET_KEY_KEY.to_owned(),
            ByteString(ca.key_pem().into_bytes()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(names::CA_SECRET.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// The CA in Secret `namespace`/[`names::CA_SECRET`]; errors name the
/// Secret and the key at fault, never what it holds.
fn ca_from_secret(namespace: &str, secret: &Secret) -> Result<CertificateAuthority> {
    let object = format!("{namespace}/{}", names::CA_SECRET);
    let get = |key: &str| -> Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| {
                Error::CaSecretInvalid(format!("Secret {object}: data[{key}] is missing"))
            })?;
        String::from_utf8(bytes.0.clone()).map_err(|_| {
            Error::CaSecretInvalid(format!("Secret {object}: data[{key}] is not UTF-8"))
        })
    };
    CertificateAuthority::from_pem(
        &get(names::CA_SECRET_CERT_KEY)?,
        &get(names::CA_SECRET_KEY_KEY)?,
    )
    .map_err(|e| match e {
        Error::CaSecretInvalid(why) => Error::CaSecretInvalid(format!("Secret {object}: {why}")),
        other => other,
    })
}
