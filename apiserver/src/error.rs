//! Errors: [`ApiError`] is a Kubernetes `Status` answered to a client;
//! [`Error`] is what the library's own API (start, client, kubeconfig) returns.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::resources::ResourceDef;
use crate::validation::FieldError;

/// Errors of the embedded API server's library API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Binding or using the listening socket failed.
    #[error("apiserver socket: {0}")]
    Io(#[from] std::io::Error),
    /// Generating the CA or the serving certificate failed.
    #[error("apiserver certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// Building the TLS configuration failed.
    #[error("apiserver TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The generated kubeconfig was refused by kube-rs.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// kube-rs could not build a client.
    #[error("kube client: {0}")]
    Client(#[from] kube::Error),
    /// A token was used that the server does not know.
    #[error("unknown token {0:?}")]
    UnknownToken(String),
    /// A bound token was asked for a Pod that is not stored.
    #[error("no pod {0}")]
    UnknownPod(String),
}

impl Error {
    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Io(_) => "io",
            Error::Certificate(_) => "certificate",
            Error::Tls(_) => "tls",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::Client(_) => "client",
            Error::UnknownToken(_) => "unknown_token",
            Error::UnknownPod(_) => "unknown_pod",
        }
    }
}

/// A failed API request, rendered as a `meta.k8s.io/v1` `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code, also the Status `code`.
    pub code: u16,
    /// The Status `reason` (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human readable message.
    pub message: String,
    /// Status `details` (name, group, kind), when the error is about one object.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, def: &ResourceDef, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": def.group, "kind": def.plural}));
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden with the authorizer's reason.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 404 NotFound for an object.
    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.resource_ref()),
        )
        .with_details(def, name)
    }

    /// 404 NotFound for a path that serves nothing.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str, what: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported on {what}"),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", def.resource_ref()),
        )
        .with_details(def, name)
    }

    /// 409 Conflict: a stale resourceVersion or a failed precondition.
    pub fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                def.resource_ref()
            ),
        )
        .with_details(def, name)
    }

    /// 410 Gone with reason Expired: the resourceVersion left the history window.
    pub fn expired(rv: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 422 Invalid: the object fails validation.
    pub fn invalid(def: &ResourceDef, name: &str, why: impl AsRef<str>) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {}", def.kind, why.as_ref()),
        )
        .with_details(def, name)
    }

    /// 422 Invalid with one `StatusCause` per field error, as
    /// kube-apiserver's `NewInvalid`: the message names the kind with its
    /// group (`CertificateSigningRequest.certificates.k8s.io`) and lists the
    /// errors (in brackets when there are several).
    pub fn invalid_fields(def: &ResourceDef, name: &str, errors: &[FieldError]) -> Self {
        let group_kind = if def.group.is_empty() {
            def.kind.to_string()
        } else {
            format!("{}.{}", def.kind, def.group)
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{group_kind} {name:?} is invalid: {}", aggregate(errors)),
        );
        err.details = Some(json!({
            "name": name, "group": def.group, "kind": def.kind,
            "causes": errors.iter().map(FieldError::cause).collect::<Vec<_>>(),
        }));
        err
    }

    /// 400 BadRequest for a create or update body that does not decode into
    /// its kind's type (`why` is the decoder's message).
    pub fn undecodable(def: &ResourceDef, why: &str) -> Self {
        Self::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: {why}",
            kind = def.kind,
            version = def.version
        ))
    }

    /// 422 Invalid for a patch whose result does not decode into its kind's
    /// type: kube-apiserver names the field `patch`, shows the patched
    /// object as its value, and leaves kind and name empty.
    pub fn invalid_patch(patched: &Value, why: &str) -> Self {
        let error = FieldError::invalid("patch", patched.to_string(), why);
        let mut err = Self::new(422, "Invalid", format!(" \"\" is invalid: {error}"));
        err.details = Some(json!({"causes": [error.cause()]}));
        err
    }

    /// 422 Invalid for a kind that is not a stored resource (a TokenRequest):
    /// `group_kind` as kube-apiserver names it (`TokenRequest.authentication.k8s.io`).
    pub fn invalid_kind(group_kind: &str, name: &str, why: impl AsRef<str>) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{group_kind} \"{name}\" is invalid: {}", why.as_ref()),
        )
    }

    /// 409 Conflict about an object named by kind (`Pod`), as kube-apiserver
    /// words a conflict outside the store.
    pub fn conflict_on(kind: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {kind} \"{name}\": {why}"),
        )
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// InternalError with another code of the 500 class (an injected fault).
    pub fn internal_code(code: u16, message: impl Into<String>) -> Self {
        Self::new(code, "InternalError", message)
    }

    /// 429 TooManyRequests, answered with `Retry-After: 1` (API priority
    /// and fairness rejecting a request).
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 504 Timeout: a list asked for a resourceVersion the server has not reached.
    pub fn too_large_resource_version(rv: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {rv}, current: {current}"),
        )
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), details.clone());
        }
        status
    }
}

/// Errors as apimachinery's `ErrorList.ToAggregate()` prints them.
fn aggregate(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => {
            let all: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.status().to_string();
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.code == 429 {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
