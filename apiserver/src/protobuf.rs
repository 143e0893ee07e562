//! Just enough of the Kubernetes protobuf encoding to read the bodies kubectl's
//! typed clients send as `application/vnd.kubernetes.protobuf`:
//! CertificateSigningRequest (`kubectl certificate approve|deny`),
//! SelfSubjectAccessReview (`kubectl auth can-i`), SelfSubjectReview
//! (`kubectl auth whoami`), TokenRequest (`kubectl create token`, the
//! kubelet), and the Namespace, ConfigMap, Secret and ServiceAccount that
//! `kubectl create namespace|configmap|secret generic|serviceaccount` build.
//! Other kinds in protobuf are refused with 415 naming the kind; answers are
//! always JSON, which client-go accepts.
//!
//! Field numbers are those of `k8s.io/api/*/generated.proto`.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The protobuf media type.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// One decoded field: number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn bad(why: &str) -> ApiError {
    ApiError::bad_request(format!("malformed protobuf body: {why}"))
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ApiError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or_else(|| bad("truncated varint"))?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(bad("varint too long"))
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ApiError> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        let f = match wire {
            0 => Field::Varint(varint(buf, &mut pos)?),
            1 | 5 => {
                pos += if wire == 1 { 8 } else { 4 };
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).map_err(|_| bad("length"))?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| bad("truncated field"))?;
                let b = &buf[pos..end];
                pos = end;
                Field::Bytes(b)
            }
            _ => return Err(bad("unsupported wire type")),
        };
        out.push((num, f));
    }
    if pos > buf.len() {
        return Err(bad("truncated fixed field"));
    }
    Ok(out)
}

fn text(b: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(b).into_owned())
}

/// Decodes a message whose fields are all strings/messages per a small schema.
type Decoder = fn(&[u8]) -> Result<Value, ApiError>;

fn message(
    buf: &[u8],
    strings: &[(u64, &str)],
    repeated: &[(u64, &str)],
    nested: &[(u64, &str, Decoder)],
) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        let Field::Bytes(b) = f else { continue };
        if let Some((_, name)) = strings.iter().find(|(n, _)| *n == num) {
            m.insert((*name).into(), text(b));
        } else if let Some((_, name)) = repeated.iter().find(|(n, _)| *n == num) {
            let list = m.entry(*name).or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(a) = list {
                a.push(text(b));
            }
        } else if let Some((_, name, dec)) = nested.iter().find(|(n, _, _)| *n == num) {
            m.insert((*name).into(), dec(b)?);
        }
    }
    Ok(Value::Object(m))
}

fn string_map_entry(b: &[u8]) -> Result<(String, Value), ApiError> {
    let mut k = String::new();
    let mut v = Value::Null;
    for (num, f) in fields(b)? {
        if let Field::Bytes(x) = f {
            match num {
                1 => k = String::from_utf8_lossy(x).into_owned(),
                2 => v = text(x),
                _ => {}
            }
        }
    }
    Ok((k, v))
}

fn object_meta(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => drop(m.insert("name".into(), text(b))),
            (2, Field::Bytes(b)) => drop(m.insert("generateName".into(), text(b))),
            (3, Field::Bytes(b)) => drop(m.insert("namespace".into(), text(b))),
            (5, Field::Bytes(b)) => drop(m.insert("uid".into(), text(b))),
            (6, Field::Bytes(b)) => drop(m.insert("resourceVersion".into(), text(b))),
            (7, Field::Varint(g)) => drop(m.insert("generation".into(), json!(g))),
            (11 | 12, Field::Bytes(b)) => {
                let key = if num == 11 { "labels" } else { "annotations" };
                let (k, v) = string_map_entry(b)?;
                if let Value::Object(map) = m.entry(key).or_insert_with(|| json!({})) {
                    map.insert(k, v);
                }
            }
            (14, Field::Bytes(b)) => {
                if let Value::Array(a) = m.entry("finalizers").or_insert_with(|| json!([])) {
                    a.push(text(b));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn time(buf: &[u8]) -> Result<Value, ApiError> {
    let mut secs = 0i64;
    for (num, f) in fields(buf)? {
        if let (1, Field::Varint(v)) = (num, f) {
            secs = v as i64;
        }
    }
    Ok(chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| Value::String(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()))
        .unwrap_or(Value::Null))
}

fn csr_condition(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[(1, "type"), (6, "status"), (2, "reason"), (3, "message")],
        &[],
        &[(4, "lastUpdateTime", time), (5, "lastTransitionTime", time)],
    )
}

fn csr_spec(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => drop(m.insert(
                "request".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(b)),
            )),
            (7, Field::Bytes(b)) => drop(m.insert("signerName".into(), text(b))),
            (8, Field::Varint(v)) => drop(m.insert("expirationSeconds".into(), json!(v))),
            (5, Field::Bytes(b)) => {
                if let Value::Array(a) = m.entry("usages").or_insert_with(|| json!([])) {
                    a.push(text(b));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn csr_status(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => {
                let c = csr_condition(b)?;
                if let Value::Array(a) = m.entry("conditions").or_insert_with(|| json!([])) {
                    a.push(c);
                }
            }
            (2, Field::Bytes(b)) => drop(m.insert(
                "certificate".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(b)),
            )),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn csr(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[],
        &[],
        &[
            (1, "metadata", object_meta),
            (2, "spec", csr_spec),
            (3, "status", csr_status),
        ],
    )
}

fn resource_attributes(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[
            (1, "namespace"),
            (2, "verb"),
            (3, "group"),
            (4, "version"),
            (5, "resource"),
            (6, "subresource"),
            (7, "name"),
        ],
        &[],
        &[],
    )
}

fn non_resource_attributes(buf: &[u8]) -> Result<Value, ApiError> {
    message(buf, &[(1, "path"), (2, "verb")], &[], &[])
}

fn ssar_spec(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[],
        &[],
        &[
            (1, "resourceAttributes", resource_attributes),
            (2, "nonResourceAttributes", non_resource_attributes),
        ],
    )
}

fn ssar(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[],
        &[],
        &[(1, "metadata", object_meta), (2, "spec", ssar_spec)],
    )
}

/// Fields of a `map<string, string>` (`bytes: false`) or `map<string,
/// bytes>` (`bytes: true`, base64 in JSON) gathered into one object.
fn map_field(
    m: &mut Map<String, Value>,
    name: &str,
    entry: &[u8],
    bytes: bool,
) -> Result<(), ApiError> {
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    for (num, f) in fields(entry)? {
        match (num, f) {
            (1, Field::Bytes(x)) => k = String::from_utf8_lossy(x).into_owned(),
            (2, Field::Bytes(x)) if bytes => {
                v = json!(base64::engine::general_purpose::STANDARD.encode(x))
            }
            (2, Field::Bytes(x)) => v = text(x),
            _ => {}
        }
    }
    if let Value::Object(map) = m.entry(name).or_insert_with(|| json!({})) {
        map.insert(k, v);
    }
    Ok(())
}

fn namespace_spec(buf: &[u8]) -> Result<Value, ApiError> {
    message(buf, &[], &[(1, "finalizers")], &[])
}

fn namespace(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[],
        &[],
        &[(1, "metadata", object_meta), (2, "spec", namespace_spec)],
    )
}

fn config_map(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => drop(m.insert("metadata".into(), object_meta(b)?)),
            (2, Field::Bytes(b)) => map_field(&mut m, "data", b, false)?,
            (3, Field::Bytes(b)) => map_field(&mut m, "binaryData", b, true)?,
            (4, Field::Varint(v)) => drop(m.insert("immutable".into(), json!(v != 0))),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn secret(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => drop(m.insert("metadata".into(), object_meta(b)?)),
            (2, Field::Bytes(b)) => map_field(&mut m, "data", b, true)?,
            (3, Field::Bytes(b)) => drop(m.insert("type".into(), text(b))),
            (4, Field::Bytes(b)) => map_field(&mut m, "stringData", b, false)?,
            (5, Field::Varint(v)) => drop(m.insert("immutable".into(), json!(v != 0))),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn object_reference(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[
            (1, "kind"),
            (2, "namespace"),
            (3, "name"),
            (4, "uid"),
            (5, "apiVersion"),
            (6, "resourceVersion"),
            (7, "fieldPath"),
        ],
        &[],
        &[],
    )
}

fn local_object_reference(buf: &[u8]) -> Result<Value, ApiError> {
    message(buf, &[(1, "name")], &[], &[])
}

fn service_account(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => drop(m.insert("metadata".into(), object_meta(b)?)),
            (2 | 3, Field::Bytes(b)) => {
                let (key, item) = if num == 2 {
                    ("secrets", object_reference(b)?)
                } else {
                    ("imagePullSecrets", local_object_reference(b)?)
                };
                if let Value::Array(a) = m.entry(key).or_insert_with(|| json!([])) {
                    a.push(item);
                }
            }
            (4, Field::Varint(v)) => {
                drop(m.insert("automountServiceAccountToken".into(), json!(v != 0)))
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn bound_object_reference(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[(1, "kind"), (2, "apiVersion"), (3, "name"), (4, "uid")],
        &[],
        &[],
    )
}

fn token_request_spec(buf: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(buf)? {
        match (num, f) {
            (1, Field::Bytes(b)) => {
                if let Value::Array(a) = m.entry("audiences").or_insert_with(|| json!([])) {
                    a.push(text(b));
                }
            }
            (3, Field::Bytes(b)) => {
                drop(m.insert("boundObjectRef".into(), bound_object_reference(b)?))
            }
            // int64: a negative value arrives as its two's complement.
            (4, Field::Varint(v)) => drop(m.insert("expirationSeconds".into(), json!(v as i64))),
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

fn token_request(buf: &[u8]) -> Result<Value, ApiError> {
    message(
        buf,
        &[],
        &[],
        &[
            (1, "metadata", object_meta),
            (2, "spec", token_request_spec),
        ],
    )
}

fn self_subject_review(buf: &[u8]) -> Result<Value, ApiError> {
    // The status (field 2) is the server's to fill in.
    message(buf, &[], &[], &[(1, "metadata", object_meta)])
}

/// The kinds whose protobuf bodies [`decode`] reads.
const DECODED: &str = "CertificateSigningRequest, SelfSubjectAccessReview, SelfSubjectReview, \
TokenRequest, Namespace, ConfigMap, Secret and ServiceAccount";

/// Decodes a protobuf request body into the JSON form of the object.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let inner = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("missing k8s envelope"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (num, f) in fields(inner)? {
        match (num, f) {
            (1, Field::Bytes(tm)) => {
                for (n, f) in fields(tm)? {
                    match (n, f) {
                        (1, Field::Bytes(b)) => {
                            api_version = String::from_utf8_lossy(b).into_owned()
                        }
                        (2, Field::Bytes(b)) => kind = String::from_utf8_lossy(b).into_owned(),
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut obj = match (api_version.as_str(), kind.as_str()) {
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => csr(raw)?,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => ssar(raw)?,
        ("v1", "Namespace") => namespace(raw)?,
        ("v1", "ConfigMap") => config_map(raw)?,
        ("v1", "Secret") => secret(raw)?,
        ("v1", "ServiceAccount") => service_account(raw)?,
        ("authentication.k8s.io/v1", "TokenRequest") => token_request(raw)?,
        ("authentication.k8s.io/v1", "SelfSubjectReview") => self_subject_review(raw)?,
        _ => {
            return Err(ApiError::unsupported_media_type(format!(
                "the lab API server reads protobuf only for {DECODED} (got {api_version:?} \
                 kind {kind:?}); send application/json"
            )));
        }
    };
    if let Value::Object(m) = &mut obj {
        m.insert("apiVersion".into(), Value::String(api_version));
        m.insert("kind".into(), Value::String(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(num << 3 | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_a_csr_approval() {
        let meta = [field(1, b"csr1"), field(6, b"42")].concat();
        let cond = [
            field(1, b"Approved"),
            field(6, b"True"),
            field(2, b"KubectlApprove"),
        ]
        .concat();
        let status = field(1, &cond);
        let raw = [field(1, &meta), field(3, &status)].concat();
        let tm = [
            field(1, b"certificates.k8s.io/v1"),
            field(2, b"CertificateSigningRequest"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &raw)].concat();
        let obj = decode(&body).unwrap();
        assert_eq!(obj["metadata"]["name"], "csr1");
        assert_eq!(obj["metadata"]["resourceVersion"], "42");
        assert_eq!(obj["status"]["conditions"][0]["type"], "Approved");
        assert_eq!(obj["status"]["conditions"][0]["status"], "True");
        assert_eq!(obj["kind"], "CertificateSigningRequest");
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Bodies captured from kubectl 1.32: `create serviceaccount
    /// kube-ovn-cni -n kube-system`, `create token kube-ovn-cni
    /// --bound-object-kind Pod --bound-object-name kube-ovn-cni-abcde
    /// --duration 20m`, and `auth whoami`.
    #[test]
    fn decodes_what_kubectl_sends_for_tokens() {
        let sa = decode(&unhex(
            "6b3873000a140a027631120e536572766963654163636f756e7412290a270a0c6b7562652d6f766e2d636e69\
             12001a0b6b7562652d73797374656d22002a003200380042001a002200",
        ))
        .unwrap();
        assert_eq!(sa["kind"], "ServiceAccount");
        assert_eq!(sa["metadata"]["name"], "kube-ovn-cni");
        assert_eq!(sa["metadata"]["namespace"], "kube-system");
        let tr = decode(&unhex(
            "6b3873000a280a1861757468656e7469636174696f6e2e6b38732e696f2f7631120c546f6b656e52657175\
             657374123e0a100a0012001a0022002a0032003800420012241a1f0a03506f64120276311a126b7562652d\
             6f766e2d636e692d6162636465220020b0091a040a0012001a002200",
        ))
        .unwrap();
        assert_eq!(tr["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(tr["kind"], "TokenRequest");
        assert_eq!(tr["spec"]["expirationSeconds"], 1200);
        assert_eq!(
            tr["spec"]["boundObjectRef"],
            json!({"kind": "Pod", "apiVersion": "v1", "name": "kube-ovn-cni-abcde", "uid": ""})
        );
        assert!(tr["spec"].get("audiences").is_none());
        let ssr = decode(&unhex(
            "6b3873000a2d0a1861757468656e7469636174696f6e2e6b38732e696f2f7631121153656c665375626a65\
             6374526576696577121a0a100a0012001a0022002a0032003800420012060a040a0012001a002200",
        ))
        .unwrap();
        assert_eq!(ssr["kind"], "SelfSubjectReview");
        assert!(ssr.get("status").is_none());
    }

    #[test]
    fn refuses_other_kinds_and_garbage() {
        let tm = [field(1, b"v1"), field(2, b"Pod")].concat();
        let body = [MAGIC.to_vec(), field(1, &tm)].concat();
        assert_eq!(decode(&body).unwrap_err().code, 415);
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
        assert_eq!(decode(b"k8s\0\x0a\x09ab").unwrap_err().code, 400);
    }
}
