//! What kube-apiserver checks of an object of a served kind before it
//! stores it: that the object decodes into the kind's Go type ([`decode`]),
//! then the kind's validation ([`validate`]).
//!
//! The two fail differently on the real server, and so here: a body that
//! does not decode is a 400 BadRequest for a create or an update ("ConfigMap
//! in version \"v1\" cannot be handled as a ConfigMap: ..."), and a 422
//! Invalid on the field `patch` when it is the result of a patch; a
//! validation failure is a 422 Invalid with one cause per field
//! ([`FieldError`], kube-apiserver's `field.Error`). Both run before the
//! store is touched, so a rejected write changes nothing.
//!
//! There are no schemas here, so decoding checks the types of the fields
//! this server and its clients read, not every field of every kind:
//! `metadata` (names, labels, annotations, finalizers, owner references),
//! ConfigMap `data` (strings) and `binaryData` (base64), Secret `data`
//! (base64) and `stringData` (strings), the CSR's spec and the Lease's spec.
//! Custom resources (cert-manager's) are left to their CRD's schema, which
//! is not emulated. Validation covers object metadata for every stored
//! kind (name per kind, labels, annotations, finalizers, owner references),
//! ConfigMap and Secret keys, sizes, Secret types and immutability, the
//! CSR's signer name, usages and request, and Lease durations; Pod, Node
//! and DaemonSet specs are not validated.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde_json::{Map, Value, json};

use crate::resources::{RESOURCES, ResourceDef, idx};

/// The kind of a field error: kube-apiserver's `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// A malformed value.
    Invalid,
    /// A value that must be given is missing.
    Required,
    /// A value not allowed here (or not any more).
    Forbidden,
    /// A value longer than its limit.
    TooLong,
    /// A value outside an enumeration.
    NotSupported,
    /// A value given twice where values must be unique.
    Duplicate,
}

impl FieldErrorKind {
    /// The `StatusCause` type (`FieldValueInvalid`, ...).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Invalid => "FieldValueInvalid",
            Self::Required => "FieldValueRequired",
            Self::Forbidden => "FieldValueForbidden",
            Self::TooLong => "FieldValueTooLong",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Duplicate => "FieldValueDuplicate",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Self::Invalid => "Invalid value",
            Self::Required => "Required value",
            Self::Forbidden => "Forbidden",
            Self::TooLong => "Too long",
            Self::NotSupported => "Unsupported value",
            Self::Duplicate => "Duplicate value",
        }
    }
}

/// One validation failure of one field, worded as kube-apiserver words it.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// The field's path (`data[key]`, `spec.usages[0]`, `metadata.labels`).
    pub field: String,
    /// The offending value, for the kinds that show it.
    pub value: Option<Value>,
    /// Why, when there is more to say.
    pub detail: String,
}

impl FieldError {
    fn new(kind: FieldErrorKind, field: &str, value: Option<Value>, detail: String) -> Self {
        FieldError {
            kind,
            field: field.to_string(),
            value,
            detail,
        }
    }

    /// A malformed value.
    pub fn invalid(field: &str, value: impl Into<Value>, detail: impl Into<String>) -> Self {
        Self::new(
            FieldErrorKind::Invalid,
            field,
            Some(value.into()),
            detail.into(),
        )
    }

    /// A missing value.
    pub fn required(field: &str, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Required, field, None, detail.into())
    }

    /// A value not allowed here.
    pub fn forbidden(field: &str, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Forbidden, field, None, detail.into())
    }

    /// A value over `max` bytes.
    pub fn too_long(field: &str, max: usize) -> Self {
        Self::new(
            FieldErrorKind::TooLong,
            field,
            None,
            format!("may not be more than {max} bytes"),
        )
    }

    /// A value outside `supported`.
    pub fn not_supported(field: &str, value: impl Into<Value>, supported: &[&str]) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self::new(
            FieldErrorKind::NotSupported,
            field,
            Some(value.into()),
            format!("supported values: {}", quoted.join(", ")),
        )
    }

    /// A value given twice.
    pub fn duplicate(field: &str, value: impl Into<Value>) -> Self {
        Self::new(
            FieldErrorKind::Duplicate,
            field,
            Some(value.into()),
            String::new(),
        )
    }

    /// The error without its field (a `StatusCause`'s message):
    /// `Invalid value: "x": why`.
    pub fn body(&self) -> String {
        let mut s = self.kind.text().to_string();
        match &self.value {
            // Strings quoted, numbers and booleans plain, anything else as
            // JSON: Go's rendering of a bad value.
            Some(Value::String(v)) => s.push_str(&format!(": {}", go_quote(v))),
            Some(v) => s.push_str(&format!(": {v}")),
            None => {}
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// The `StatusCause` for this error.
    pub fn cause(&self) -> Value {
        json!({"reason": self.kind.reason(), "message": self.body(), "field": self.field})
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// A string quoted as Go's `%q` does for the printable text of API
/// objects (JSON's escaping is the same for it).
fn go_quote(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

// ---------------------------------------------------------------------------
// Decoding: the types of the fields that are read.

/// The Go types a checked field decodes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoType {
    String,
    Bytes,
    Bool,
    Int32,
    Int64,
    /// `metav1.Time`/`MicroTime`: an RFC 3339 string.
    Time,
    Strings,
    StringMap,
    BytesMap,
    /// A struct, named as Go's errors name it.
    Struct(&'static str),
}

impl GoType {
    fn name(self) -> &'static str {
        match self {
            GoType::String => "string",
            GoType::Bytes => "[]uint8",
            GoType::Bool => "bool",
            GoType::Int32 => "int32",
            GoType::Int64 => "int64",
            GoType::Time => "v1.Time",
            GoType::Strings => "[]string",
            GoType::StringMap => "map[string]string",
            GoType::BytesMap => "map[string][]uint8",
            GoType::Struct(name) => name,
        }
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Where a field is, for Go's message: the struct that holds it and the
/// field's path from the object's root.
#[derive(Clone, Copy)]
struct At<'a> {
    owner: &'a str,
    path: &'a str,
}

fn type_error(v: &Value, at: At<'_>, ty: GoType) -> String {
    let what = match v {
        Value::Number(n) if matches!(ty, GoType::Int32 | GoType::Int64) => format!("number {n}"),
        _ => json_type(v).to_string(),
    };
    format!(
        "json: cannot unmarshal {what} into Go struct field {}.{} of type {}",
        at.owner,
        at.path,
        ty.name()
    )
}

/// Go's `encoding/json` decodes `[]byte` from standard base64 with
/// padding, skipping line breaks, and does not insist on zero trailing bits.
const GO_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
);

/// The decoded bytes of a `[]byte` field, or Go's error.
fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    let cleaned: String;
    let text = if s.contains(['\r', '\n']) {
        cleaned = s.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
        cleaned.as_str()
    } else {
        s
    };
    GO_BASE64.decode(text).map_err(|e| {
        let at = match e {
            base64::DecodeError::InvalidByte(at, _)
            | base64::DecodeError::InvalidLastSymbol(at, _) => at,
            base64::DecodeError::InvalidLength(_) | base64::DecodeError::InvalidPadding => {
                text.len()
            }
        };
        format!("illegal base64 data at input byte {at}")
    })
}

/// Checks that `v` decodes into `ty`. A JSON `null` decodes into anything
/// (Go leaves the zero value), and a `null` inside a map or list becomes
/// the element's zero value, `""`, as it would on the real server.
fn check(v: &mut Value, ty: GoType, at: At<'_>) -> Result<(), String> {
    let ok = match (ty, &mut *v) {
        (_, Value::Null) => true,
        (GoType::String | GoType::Time, Value::String(_)) => true,
        (GoType::Bytes, Value::String(s)) => {
            decode_base64(s)?;
            true
        }
        (GoType::Bool, Value::Bool(_)) => true,
        (GoType::Int32, Value::Number(n)) => n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
        (GoType::Int64, Value::Number(n)) => n.as_i64().is_some(),
        (GoType::Strings, Value::Array(items)) => {
            for item in items {
                check_element(item, GoType::String, at)?;
            }
            true
        }
        (GoType::StringMap | GoType::BytesMap, Value::Object(map)) => {
            let element = if ty == GoType::BytesMap {
                GoType::Bytes
            } else {
                GoType::String
            };
            for item in map.values_mut() {
                check_element(item, element, at)?;
            }
            true
        }
        (GoType::Struct(_), Value::Object(_)) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(type_error(v, at, ty))
    }
}

fn check_element(item: &mut Value, ty: GoType, at: At<'_>) -> Result<(), String> {
    if item.is_null() {
        *item = Value::String(String::new());
        return Ok(());
    }
    check(item, ty, at)
}

/// Checks the named fields of `map` (the struct `owner`, at `prefix`).
fn check_fields(
    map: &mut Map<String, Value>,
    owner: &str,
    prefix: &str,
    fields: &[(&str, GoType)],
) -> Result<(), String> {
    for (name, ty) in fields {
        if let Some(v) = map.get_mut(*name) {
            let path = if prefix.is_empty() {
                (*name).to_string()
            } else {
                format!("{prefix}.{name}")
            };
            check(v, *ty, At { owner, path: &path })?;
        }
    }
    Ok(())
}

/// The struct at `key` of `map`, checked to be one.
fn sub_struct<'m>(
    map: &'m mut Map<String, Value>,
    key: &str,
    owner: &str,
    ty: &'static str,
) -> Result<Option<&'m mut Map<String, Value>>, String> {
    let Some(v) = map.get_mut(key) else {
        return Ok(None);
    };
    check(v, GoType::Struct(ty), At { owner, path: key })?;
    Ok(v.as_object_mut())
}

/// Checks that `obj` decodes into its kind's Go type as far as the fields
/// this server knows, normalising `null` map and list elements to `""` as
/// the real decoding does. The error is Go's message, which the caller
/// wraps in the API error of an undecodable body (a create or update) or
/// of an invalid patch (a patch's result).
pub fn decode(def: &ResourceDef, obj: &mut Value) -> Result<(), String> {
    // Custom resources have their CRD's schema, not a Go type.
    if !def.builtin {
        return Ok(());
    }
    let Some(map) = obj.as_object_mut() else {
        return Ok(());
    };
    let kind = def.kind;
    if let Some(meta) = sub_struct(map, "metadata", kind, "v1.ObjectMeta")? {
        decode_meta(meta)?;
    }
    match kind {
        "ConfigMap" => check_fields(
            map,
            kind,
            "",
            &[
                ("data", GoType::StringMap),
                ("binaryData", GoType::BytesMap),
                ("immutable", GoType::Bool),
            ],
        ),
        "Secret" => check_fields(
            map,
            kind,
            "",
            &[
                ("data", GoType::BytesMap),
                ("stringData", GoType::StringMap),
                ("type", GoType::String),
                ("immutable", GoType::Bool),
            ],
        ),
        "CertificateSigningRequest" => {
            match sub_struct(map, "spec", kind, "v1.CertificateSigningRequestSpec")? {
                Some(spec) => check_fields(
                    spec,
                    "CertificateSigningRequestSpec",
                    "spec",
                    &[
                        ("request", GoType::Bytes),
                        ("signerName", GoType::String),
                        ("expirationSeconds", GoType::Int32),
                        ("usages", GoType::Strings),
                        ("username", GoType::String),
                        ("uid", GoType::String),
                        ("groups", GoType::Strings),
                    ],
                ),
                None => Ok(()),
            }
        }
        "Lease" => match sub_struct(map, "spec", kind, "v1.LeaseSpec")? {
            Some(spec) => check_fields(
                spec,
                "LeaseSpec",
                "spec",
                &[
                    ("holderIdentity", GoType::String),
                    ("leaseDurationSeconds", GoType::Int32),
                    ("acquireTime", GoType::Time),
                    ("renewTime", GoType::Time),
                    ("leaseTransitions", GoType::Int32),
                ],
            ),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

fn decode_meta(meta: &mut Map<String, Value>) -> Result<(), String> {
    check_fields(
        meta,
        "ObjectMeta",
        "metadata",
        &[
            ("name", GoType::String),
            ("generateName", GoType::String),
            ("namespace", GoType::String),
            ("uid", GoType::String),
            ("resourceVersion", GoType::String),
            ("generation", GoType::Int64),
            ("labels", GoType::StringMap),
            ("annotations", GoType::StringMap),
            ("finalizers", GoType::Strings),
        ],
    )?;
    let Some(refs) = meta.get_mut("ownerReferences") else {
        return Ok(());
    };
    let at = At {
        owner: "ObjectMeta",
        path: "metadata.ownerReferences",
    };
    match refs {
        Value::Null => Ok(()),
        Value::Array(items) => {
            for item in items {
                check(item, GoType::Struct("v1.OwnerReference"), at)?;
                if let Some(r) = item.as_object_mut() {
                    check_fields(
                        r,
                        "OwnerReference",
                        "metadata.ownerReferences",
                        &[
                            ("apiVersion", GoType::String),
                            ("kind", GoType::String),
                            ("name", GoType::String),
                            ("uid", GoType::String),
                            ("controller", GoType::Bool),
                            ("blockOwnerDeletion", GoType::Bool),
                        ],
                    )?;
                }
            }
            Ok(())
        }
        other => Err(type_error(other, at, GoType::Struct("[]v1.OwnerReference"))),
    }
}

// ---------------------------------------------------------------------------
// Validation.

/// The largest ConfigMap or Secret payload (`core.MaxSecretSize`).
pub const MAX_DATA_SIZE: usize = 1024 * 1024;

/// The largest total of an object's annotation keys and values.
pub const MAX_ANNOTATIONS_SIZE: usize = 256 * 1024;

/// The usages a CSR may ask for (`certificates.KeyUsage`), sorted as
/// kube-apiserver lists them.
const CSR_USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// Validates an object about to be stored: `old` is the stored object for
/// an update, `None` for a create. Empty when the object is valid.
pub fn validate(def: &ResourceDef, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(def, obj, old, &mut errs);
    match def.kind {
        "ConfigMap" if def.builtin => validate_config_map(obj, old, &mut errs),
        "Secret" if def.builtin => validate_secret(obj, old, &mut errs),
        "Lease" if def.builtin => validate_lease(obj, &mut errs),
        _ if std::ptr::eq(def, &RESOURCES[idx::CSRS]) => validate_csr(obj, &mut errs),
        _ => {}
    }
    errs
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn map_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v Map<String, Value>> {
    v.pointer(pointer).and_then(Value::as_object)
}

fn strings_at<'v>(v: &'v Value, pointer: &str) -> Vec<&'v str> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The rule a kind's names follow on the real server.
fn name_errors(def: &ResourceDef, name: &str) -> Vec<String> {
    if def.kind == "Namespace" && def.builtin {
        return is_dns1123_label(name);
    }
    // RBAC names only need to be path segments (`system:node`); a CSR's
    // name is not validated at all beyond that ("we don't care what you
    // call your certificate requests").
    if def.group == "rbac.authorization.k8s.io" || std::ptr::eq(def, &RESOURCES[idx::CSRS]) {
        return is_path_segment_name(name);
    }
    is_dns1123_subdomain(name)
}

fn validate_meta(def: &ResourceDef, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let name = str_at(obj, "/metadata/name");
    if old.is_none() {
        if name.is_empty() {
            errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        } else {
            for msg in name_errors(def, name) {
                errs.push(FieldError::invalid("metadata.name", name, msg));
            }
        }
    }
    if let Some(labels) = map_at(obj, "/metadata/labels") {
        for (k, v) in labels {
            for msg in is_qualified_name(k) {
                errs.push(FieldError::invalid("metadata.labels", k.as_str(), msg));
            }
            let v = v.as_str().unwrap_or("");
            for msg in is_valid_label_value(v) {
                errs.push(FieldError::invalid("metadata.labels", v, msg));
            }
        }
    }
    if let Some(annotations) = map_at(obj, "/metadata/annotations") {
        let mut size = 0usize;
        for (k, v) in annotations {
            for msg in is_qualified_name(&k.to_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", k.as_str(), msg));
            }
            size += k.len() + v.as_str().map_or(0, str::len);
        }
        if size > MAX_ANNOTATIONS_SIZE {
            errs.push(FieldError::too_long(
                "metadata.annotations",
                MAX_ANNOTATIONS_SIZE,
            ));
        }
    }
    let finalizers = strings_at(obj, "/metadata/finalizers");
    for f in &finalizers {
        for msg in is_qualified_name(f) {
            errs.push(FieldError::invalid("metadata.finalizers", *f, msg));
        }
    }
    if finalizers.contains(&"orphan") && finalizers.contains(&"foregroundDeletion") {
        errs.push(FieldError::invalid(
            "metadata.finalizers",
            json!(finalizers),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    if let Some(old) = old
        && old.pointer("/metadata/deletionTimestamp").is_some()
    {
        let before = strings_at(old, "/metadata/finalizers");
        let mut added: Vec<&str> = finalizers
            .iter()
            .copied()
            .filter(|f| !before.contains(f))
            .collect();
        added.sort_unstable();
        added.dedup();
        if !added.is_empty() {
            let list: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    list.join(", ")
                ),
            ));
        }
    }
    validate_owner_references(obj, errs);
}

fn validate_owner_references(obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(refs) = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
    else {
        return;
    };
    let path = "metadata.ownerReferences";
    let mut controller: Option<String> = None;
    for r in refs {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        let api_version = s("apiVersion");
        // `group/version`, or a core group's bare version; anything with
        // more slashes parses as no version at all.
        let version = match api_version.split('/').collect::<Vec<_>>().as_slice() {
            [version] | [_, version] => *version,
            _ => "",
        };
        if version.is_empty() {
            errs.push(FieldError::invalid(
                &format!("{path}.apiVersion"),
                api_version,
                "version must not be empty",
            ));
        }
        for field in ["kind", "name", "uid"] {
            if s(field).is_empty() {
                errs.push(FieldError::invalid(
                    &format!("{path}.{field}"),
                    "",
                    "must not be empty",
                ));
            }
        }
        if api_version == "v1" && s("kind") == "Event" {
            errs.push(FieldError::invalid(
                path,
                r.clone(),
                "/v1, Kind=Event is disallowed from being an owner",
            ));
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            let this = format!("{}/{}", s("kind"), s("name"));
            match &controller {
                Some(first) => errs.push(FieldError::invalid(
                    path,
                    Value::Array(refs.clone()),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => controller = Some(this),
            }
        }
    }
}

fn validate_config_map(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let data = map_at(obj, "/data");
    let binary = map_at(obj, "/binaryData");
    let mut size = 0usize;
    for (key, value) in data.into_iter().flatten() {
        let field = format!("data[{key}]");
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid(&field, key.as_str(), msg));
        }
        if binary.is_some_and(|b| b.contains_key(key)) {
            errs.push(FieldError::invalid(
                &field,
                key.as_str(),
                "duplicate of key present in binaryData",
            ));
        }
        size += value.as_str().map_or(0, str::len);
    }
    for (key, value) in binary.into_iter().flatten() {
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid(
                &format!("binaryData[{key}]"),
                key.as_str(),
                msg,
            ));
        }
        size += value.as_str().map_or(0, decoded_len);
    }
    if size > MAX_DATA_SIZE {
        // The path "" names the whole object.
        errs.push(FieldError::too_long("", MAX_DATA_SIZE));
    }
    if let Some(old) = old {
        immutable_payload(obj, old, &["data", "binaryData"], errs);
    }
}

/// Once `immutable` is true it stays so, and so does the payload.
fn immutable_payload(obj: &Value, old: &Value, payload: &[&str], errs: &mut Vec<FieldError>) {
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    const WHY: &str = "field is immutable when `immutable` is set";
    if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(FieldError::forbidden("immutable", WHY));
    }
    for field in payload {
        if empty_as_none(obj.get(*field)) != empty_as_none(old.get(*field)) {
            errs.push(FieldError::forbidden(field, WHY));
        }
    }
}

/// A missing, null or empty map are the same Go map for a comparison.
fn empty_as_none(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty()))
}

/// The length of what a base64 string decodes to.
fn decoded_len(s: &str) -> usize {
    let chars = s
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n' | '='))
        .count();
    chars * 3 / 4
}

/// Keys and size as for a ConfigMap, the data keys each Secret type
/// requires, and on update an immutable `type` (and payload, once
/// `immutable`).
fn validate_secret(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let data = map_at(obj, "/data");
    let mut size = 0usize;
    for (key, value) in data.into_iter().flatten() {
        for msg in is_config_map_key(key) {
            errs.push(FieldError::invalid(
                &format!("data[{key}]"),
                key.as_str(),
                msg,
            ));
        }
        size += value.as_str().map_or(0, decoded_len);
    }
    if size > MAX_DATA_SIZE {
        errs.push(FieldError::too_long("data", MAX_DATA_SIZE));
    }
    let has = |key: &str| data.is_some_and(|d| d.contains_key(key));
    let required = |key: &str| FieldError::required(&format!("data[{key}]"), "");
    let secret_type = str_at(obj, "/type");
    let service_account = str_at(
        obj,
        "/metadata/annotations/kubernetes.io~1service-account.name",
    );
    match secret_type {
        "kubernetes.io/service-account-token" if service_account.is_empty() => {
            errs.push(FieldError::required(
                "metadata.annotations[kubernetes.io/service-account.name]",
                "",
            ));
        }
        "kubernetes.io/dockercfg" if !has(".dockercfg") => errs.push(required(".dockercfg")),
        "kubernetes.io/dockerconfigjson" if !has(".dockerconfigjson") => {
            errs.push(required(".dockerconfigjson"));
        }
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            errs.push(required("username"));
            errs.push(required("password"));
        }
        "kubernetes.io/ssh-auth" if str_at(obj, "/data/ssh-privatekey").is_empty() => {
            errs.push(required("ssh-privatekey"));
        }
        "kubernetes.io/tls" => {
            for key in ["tls.crt", "tls.key"] {
                if !has(key) {
                    errs.push(required(key));
                }
            }
        }
        _ => {}
    }
    if let Some(old) = old {
        let before = str_at(old, "/type");
        if before != secret_type {
            errs.push(FieldError::invalid(
                "type",
                secret_type,
                "field is immutable",
            ));
        }
        immutable_payload(obj, old, &["data"], errs);
    }
}

fn validate_lease(obj: &Value, errs: &mut Vec<FieldError>) {
    let int = |p: &str| obj.pointer(p).and_then(Value::as_i64);
    if let Some(d) = int("/spec/leaseDurationSeconds")
        && d <= 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            d,
            "must be greater than 0",
        ));
    }
    if let Some(t) = int("/spec/leaseTransitions")
        && t < 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseTransitions",
            t,
            "must be greater than or equal to 0",
        ));
    }
}

fn validate_csr(obj: &Value, errs: &mut Vec<FieldError>) {
    let request = str_at(obj, "/spec/request");
    let pem = decode_base64(request).unwrap_or_default();
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE REQUEST-----") {
        errs.push(FieldError::invalid(
            "spec.request",
            request,
            "PEM block type must be CERTIFICATE REQUEST",
        ));
    }
    let usages = strings_at(obj, "/spec/usages");
    if usages.is_empty() {
        errs.push(FieldError::required("spec.usages", ""));
    }
    for (i, usage) in usages.iter().enumerate() {
        if !CSR_USAGES.contains(usage) {
            errs.push(FieldError::not_supported(
                &format!("spec.usages[{i}]"),
                *usage,
                CSR_USAGES,
            ));
        }
        if usages[..i].contains(usage) {
            errs.push(FieldError::duplicate(&format!("spec.usages[{i}]"), *usage));
        }
    }
    let signer = str_at(obj, "/spec/signerName");
    if signer == "kubernetes.io/legacy-unknown" {
        errs.push(FieldError::invalid(
            "spec.signerName",
            signer,
            "the legacy signerName is not allowed via this API version",
        ));
    } else {
        errs.extend(signer_name_errors("spec.signerName", signer));
    }
    if let Some(secs) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && secs < 600
    {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            secs,
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
}

/// A signer name is `<domain>/<path>`: a domain of at least two DNS labels,
/// a path of DNS subdomains, at most 571 characters
/// (`ValidateSignerName`).
pub fn signer_name_errors(field: &str, signer: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if signer.is_empty() {
        errs.push(FieldError::required(field, ""));
        return errs;
    }
    let Some((domain, path)) = signer.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        errs.push(FieldError::invalid(
            field,
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return errs;
    };
    const SUBDOMAIN_MAX: usize = 253;
    const LABEL_MAX: usize = 63;
    if domain.len() > SUBDOMAIN_MAX {
        errs.push(FieldError::too_long(field, SUBDOMAIN_MAX));
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if let Some((label, msgs)) = labels
        .iter()
        .map(|l| (l, is_dns1123_label(l)))
        .find(|(_, m)| !m.is_empty())
    {
        for msg in msgs {
            errs.push(FieldError::invalid(
                field,
                domain,
                format!("validating label {label:?}: {msg}"),
            ));
        }
    }
    if labels.len() < 2 {
        errs.push(FieldError::invalid(
            field,
            domain,
            "should be a domain with at least two segments separated by dots",
        ));
    }
    if let Some((label, msgs)) = path
        .split('.')
        .map(|l| (l, is_dns1123_subdomain(l)))
        .find(|(_, m)| !m.is_empty())
    {
        for msg in msgs {
            errs.push(FieldError::invalid(
                field,
                path,
                format!("validating label {label:?}: {msg}"),
            ));
        }
    }
    let max = SUBDOMAIN_MAX + (SUBDOMAIN_MAX + LABEL_MAX + 1) + 1;
    if signer.len() > max {
        errs.push(FieldError::too_long(field, max));
    }
    errs
}

// ---------------------------------------------------------------------------
// The name formats of `k8s.io/apimachinery/pkg/util/validation`, with its
// messages.

/// `msg (e.g. 'a',  or 'b', regex used for validation is 'fmt')`, exactly
/// as apimachinery's `RegexError` words it (two spaces before "or").
fn regex_error(msg: &str, format: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{format}')",
        examples.join(" or ")
    )
}

fn max_len_error(max: usize) -> String {
    format!("must be no more than {max} characters")
}

fn is_alnum_lower(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns1123_label(s: &str) -> bool {
    s.starts_with(is_alnum_lower)
        && s.ends_with(is_alnum_lower)
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

/// apimachinery's `IsDNS1123Label`.
pub fn is_dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !matches_dns1123_label(s) {
        if matches_dns1123_subdomain(s) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                "[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// apimachinery's `IsDNS1123Subdomain`.
pub fn is_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !matches_dns1123_subdomain(s) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
            &["example.com"],
        ));
    }
    errs
}

/// apimachinery's `IsValidPathSegmentName`.
pub fn is_path_segment_name(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|bad| s.contains(**bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn matches_qualified_name_part(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

/// apimachinery's `IsQualifiedName`: label keys, annotation keys (lower
/// cased first), finalizers.
pub fn is_qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                for msg in is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {msg}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// apimachinery's `IsValidLabelValue`.
pub fn is_valid_label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !s.is_empty() && !matches_qualified_name_part(s) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// apimachinery's `IsConfigMapKey`: ConfigMap and Secret data keys.
pub fn is_config_map_key(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        errs.push(regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            "[-._a-zA-Z0-9]+",
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if s == "." {
        errs.push("must not be '.'".into());
    } else if s == ".." {
        errs.push("must not be '..'".into());
    } else if s.starts_with("..") {
        errs.push("must not start with '..'".into());
    }
    errs
}

#[cfg(test)]
mod tests;
