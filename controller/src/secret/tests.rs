use super::*;

const OBJECT: &str = "kube-system/ovn-ipsec-ca";
const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEH\n-----END PRIVATE KEY-----\n";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn secret_with(data: Value) -> Vec<u8> {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ovn-ipsec-ca", "namespace": "kube-system", "resourceVersion": "7"},
        "type": "kubernetes.io/tls",
        "data": data,
    })
    .to_string()
    .into_bytes()
}

/// The error's text, checked to carry no part of the key.
fn error_of(body: &[u8]) -> String {
    let text = decode(OBJECT, body).unwrap_err().to_string();
    for secret in ["BEGIN", "MIGHAgEAMBMG", &b64(KEY_PEM)[..20]] {
        assert!(!text.contains(secret), "{text}");
    }
    assert!(text.contains(OBJECT), "{text}");
    text
}

#[test]
fn a_well_formed_secret_decodes_with_its_metadata() {
    let s = decode(
        OBJECT,
        &secret_with(serde_json::json!({"tls.key": b64(KEY_PEM), "empty": null})),
    )
    .unwrap();
    assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = s.data.unwrap();
    assert_eq!(data["tls.key"].0, KEY_PEM.as_bytes());
    assert!(data["empty"].0.is_empty());
}

#[test]
fn each_fault_names_the_field_and_never_the_value() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            secret_with(serde_json::json!({"tls.key": format!("{}!", b64(KEY_PEM))})),
            "data[tls.key] is not valid base64",
        ),
        (
            secret_with(serde_json::json!({"tls.key": 42})),
            "data[tls.key] is a number, not string",
        ),
        (
            secret_with(serde_json::json!({"tls.key": {"pem": KEY_PEM}})),
            "data[tls.key] is an object, not string",
        ),
        (
            secret_with(serde_json::json!(KEY_PEM)),
            "data is a string, not object",
        ),
        (
            serde_json::json!({"kind": "Secret", "metadata": {"name": 5,
                "annotations": {"last-applied": KEY_PEM}}})
            .to_string()
            .into_bytes(),
            "metadata does not decode",
        ),
        (
            serde_json::json!({"kind": "Secret", "metadata": {}, "type": KEY_PEM.len()})
                .to_string()
                .into_bytes(),
            "type is a number, not string",
        ),
        (
            serde_json::json!({"kind": KEY_PEM, "metadata": {}})
                .to_string()
                .into_bytes(),
            "kind is not Secret",
        ),
        (
            serde_json::json!([KEY_PEM]).to_string().into_bytes(),
            "the response is an array, not an object",
        ),
    ];
    for (body, expected) in cases {
        let text = error_of(&body);
        assert!(text.contains(expected), "{text} (expected {expected:?})");
    }
}

#[test]
fn a_truncated_body_is_reported_by_position() {
    let body = secret_with(serde_json::json!({"tls.key": b64(KEY_PEM)}));
    let cut = &body[..body.len() / 2];
    let text = error_of(cut);
    assert!(
        text.contains("the response is not JSON: it ends early (line 1, column"),
        "{text}"
    );
    let garbage = format!("{{\"data\": {KEY_PEM}}}");
    let text = error_of(garbage.as_bytes());
    assert!(text.contains("syntax error at line 1"), "{text}");
}

#[test]
fn an_error_answer_is_its_status_or_its_code_alone() {
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "secrets \"x\" already exists", "reason": "AlreadyExists", "code": 409});
    match api_error(409, status.to_string().as_bytes()) {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("{other:?}"),
    }
    match api_error(502, KEY_PEM.as_bytes()) {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 502);
            assert!(!s.message.contains("BEGIN"), "{}", s.message);
        }
        other => panic!("{other:?}"),
    }
}
