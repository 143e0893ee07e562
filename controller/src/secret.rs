//! Secrets, read and written without kube-rs ever decoding their bodies.
//!
//! kube-rs decodes a response in `Client::request` and, when that fails,
//! logs the whole body at WARN; and serde's message for a value of the
//! wrong type quotes the value (`invalid type: string "-----BEGIN …"`), so
//! the error itself would carry it to whoever logs it. For the CA Secret
//! both mean the CA's private key in the log. Every Secret request of the
//! controller therefore goes through `Client::send` (the transport, which
//! logs no body) and its body is decoded by [`decode`], whose errors name
//! the object and the field and describe what is wrong with it — never
//! the value, nor a library's message about it. Error responses are read
//! as a `Status` (the API server's own words); a body that is not one is
//! reported by its status code alone.
//!
//! Writes go the same way: the response to a create or replace holds the
//! stored Secret too, and is only checked for success.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{GetParams, PostParams};
use kube::core::Status;
use serde_json::Value;

use base64::Engine as _;

use crate::error::{Error, Result};

/// `namespace/name`, as errors name a Secret.
fn object_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn request(namespace: &str) -> kube::core::Request {
    kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/secrets"))
}

/// Reads Secret `namespace/name`; `None` when it does not exist.
pub async fn get_opt(client: &Client, namespace: &str, name: &str) -> Result<Option<Secret>> {
    let req = request(namespace)
        .get(name, &GetParams::default())
        .map_err(|e| Error::Kube(kube::Error::BuildRequest(e)))?;
    let (code, body) = send(client, req).await?;
    match code {
        200..=299 => decode(&object_name(namespace, name), &body).map(Some),
        404 => Ok(None),
        _ => Err(Error::Kube(api_error(code, &body))),
    }
}

/// Reads Secret `namespace/name`; a missing Secret is a 404 API error,
/// as `Api::get` reports it.
pub async fn get(client: &Client, namespace: &str, name: &str) -> Result<Secret> {
    get_opt(client, namespace, name).await?.ok_or_else(|| {
        Error::Kube(kube::Error::Api(
            Status::failure(&format!("secrets \"{name}\" not found"), "NotFound")
                .with_code(404)
                .boxed(),
        ))
    })
}

/// Creates `secret` in `namespace`. A conflict is the API error it is
/// (code 409), for the caller to match.
pub async fn create(client: &Client, namespace: &str, secret: &Secret) -> Result<()> {
    let body = serde_json::to_vec(secret).map_err(|e| Error::Kube(kube::Error::SerdeError(e)))?;
    let req = request(namespace)
        .create(&PostParams::default(), body)
        .map_err(|e| Error::Kube(kube::Error::BuildRequest(e)))?;
    expect_success(client, req).await
}

/// Replaces Secret `namespace/name` with `secret`; its resourceVersion,
/// when set, is the precondition (a stale one is a 409 API error).
pub async fn replace(client: &Client, namespace: &str, name: &str, secret: &Secret) -> Result<()> {
    let body = serde_json::to_vec(secret).map_err(|e| Error::Kube(kube::Error::SerdeError(e)))?;
    let req = request(namespace)
        .replace(name, &PostParams::default(), body)
        .map_err(|e| Error::Kube(kube::Error::BuildRequest(e)))?;
    expect_success(client, req).await
}

async fn expect_success(client: &Client, req: http::Request<Vec<u8>>) -> Result<()> {
    let (code, body) = send(client, req).await?;
    if (200..=299).contains(&code) {
        Ok(())
    } else {
        Err(Error::Kube(api_error(code, &body)))
    }
}

/// Sends `req` and reads the whole answer: the status code and the body.
async fn send(client: &Client, req: http::Request<Vec<u8>>) -> Result<(u16, Vec<u8>)> {
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(Error::Kube)?;
    let code = res.status().as_u16();
    let body = res.into_body().collect_bytes().await.map_err(Error::Kube)?;
    Ok((code, body.to_vec()))
}

/// The API error of a failed request: the API server's `Status`, or, for
/// a body that is not one, a `Status` naming only the code (the body of a
/// failed Secret request is not echoed either).
fn api_error(code: u16, body: &[u8]) -> kube::Error {
    let status = match serde_json::from_slice::<Status>(body) {
        Ok(s) if s.code != 0 => s,
        _ => Status::failure(
            &format!("the API server answered {code} with a body that is not a Status"),
            "Unknown",
        )
        .with_code(code),
    };
    kube::Error::Api(status.boxed())
}

/// Decodes the JSON `body` of Secret `object` (`namespace/name`, for the
/// errors). Every error is [`Error::SecretUndecodable`], naming the field
/// and what is wrong with it in words of this module.
pub fn decode(object: &str, body: &[u8]) -> Result<Secret> {
    let fail = |field: &str, problem: String| Error::SecretUndecodable {
        secret: object.to_owned(),
        field: field.to_owned(),
        problem,
    };
    let value: Value =
        serde_json::from_slice(body).map_err(|e| fail("the response", json_problem(&e)))?;
    let Value::Object(mut map) = value else {
        return Err(fail(
            "the response",
            format!("is {}, not an object", kind(&value)),
        ));
    };
    match map.get("kind") {
        Some(Value::String(k)) if k == "Secret" => {}
        Some(Value::String(_)) => return Err(fail("kind", "is not Secret".into())),
        other => return Err(fail("kind", not_a("string", other))),
    }
    let metadata: ObjectMeta = match map.remove("metadata") {
        Some(v @ Value::Object(_)) => serde_json::from_value(v).map_err(|_| {
            // serde's message may quote a value: an annotation such as
            // kubectl's last-applied-configuration holds the data too.
            fail(
                "metadata",
                "does not decode as object metadata (a field has the wrong type)".into(),
            )
        })?,
        other => return Err(fail("metadata", not_a("object", other.as_ref()))),
    };
    let type_ = match map.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t.clone()),
        other => return Err(fail("type", not_a("string", other))),
    };
    let immutable = match map.get("immutable") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        other => return Err(fail("immutable", not_a("boolean", other))),
    };
    let data = match map.get("data") {
        None | Some(Value::Null) => None,
        Some(Value::Object(entries)) => {
            let mut data = BTreeMap::new();
            for (key, v) in entries {
                let field = format!("data[{key}]");
                let bytes = match v {
                    Value::Null => Vec::new(),
                    Value::String(s) => base64::engine::general_purpose::STANDARD
                        .decode(s)
                        .map_err(|_| fail(&field, "is not valid base64".into()))?,
                    other => return Err(fail(&field, not_a("string", Some(other)))),
                };
                data.insert(key.clone(), ByteString(bytes));
            }
            Some(data)
        }
        other => return Err(fail("data", not_a("object", other))),
    };
    Ok(Secret {
        metadata,
        type_,
        immutable,
        data,
        // Write-only: the API server never returns it.
        string_data: None,
    })
}

/// What a body that is not JSON looks like, by position only (serde's
/// message is not used: it is not needed to find the fault).
fn json_problem(e: &serde_json::Error) -> String {
    let at = format!("line {}, column {}", e.line(), e.column());
    match e.classify() {
        serde_json::error::Category::Eof => format!("is not JSON: it ends early ({at})"),
        serde_json::error::Category::Syntax => format!("is not JSON: syntax error at {at}"),
        serde_json::error::Category::Data => format!("does not decode at {at}"),
        serde_json::error::Category::Io => "could not be read".into(),
    }
}

fn not_a(expected: &str, found: Option<&Value>) -> String {
    match found {
        None => format!("is missing (expected {expected})"),
        Some(v) => format!("is {}, not {expected}", kind(v)),
    }
}

/// The JSON type of `v`, in words.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
