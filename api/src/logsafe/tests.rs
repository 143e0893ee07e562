use super::*;
use base64::Engine as _;

const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSecretSecretSecret\nhRANCAAQ0L0x7VpgJ3mIxZbY0hOuEctvKk2mP7qY3h5bYbUqOZQ==\n-----END PRIVATE KEY-----\n";

fn text(b: Cow<'_, [u8]>) -> String {
    String::from_utf8(b.into_owned()).unwrap()
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn a_line_without_secrets_is_borrowed_unchanged() {
    let line = br#"{"level":"INFO","fields":{"message":"signed IPsec CSR","csr":"ovn-ipsec-1"}}"#;
    assert!(matches!(redact(line), Cow::Borrowed(l) if l == line));
}

#[test]
fn a_pem_block_in_a_json_line_goes_and_the_line_stays_json() {
    let line = serde_json::json!({"message": format!("body {KEY} end"), "n": 1}).to_string();
    let out = text(redact(line.as_bytes()));
    assert!(!out.contains("BEGIN") && !out.contains("Secret"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["message"], format!("body {PEM_MARKER}\n end"));
}

#[test]
fn a_quoted_pem_in_an_error_message_goes_without_breaking_escapes() {
    // serde's "invalid type: string \"…\"" inside a JSON log line: the PEM
    // is escaped twice.
    let message = format!("invalid type: string {KEY:?}, expected a map");
    let line = serde_json::json!({ "error": message }).to_string();
    let out = text(redact(line.as_bytes()));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["error"],
        format!("invalid type: string \"{PEM_MARKER}\\n\", expected a map")
    );
}

#[test]
fn a_truncated_pem_goes_up_to_where_the_line_ends() {
    let cut = &KEY[..60];
    let out = text(redact(format!("text {cut}").as_bytes()));
    assert_eq!(out, format!("text {PEM_MARKER}"));
}

#[test]
fn base64_of_a_pem_goes_at_each_alignment() {
    for prefix in ["", "x", "xy", "xyz"] {
        let encoded = b64(&format!("{prefix}{KEY}"));
        let line = format!(r#"{{"data":{{"tls.key":"{encoded}"}},"k":"v"}}"#);
        let out = text(redact(line.as_bytes()));
        assert_eq!(
            out,
            format!(r#"{{"data":{{"tls.key":"{BASE64_PEM_MARKER}"}},"k":"v"}}"#),
            "prefix {prefix:?}"
        );
    }
}

#[test]
fn a_jwt_goes_and_its_neighbours_stay() {
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJl-_x";
    let out = text(redact(format!("Bearer {jwt}, then more").as_bytes()));
    assert_eq!(out, format!("Bearer {TOKEN_MARKER}, then more"));
    let unsigned = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.";
    assert_eq!(text(redact(unsigned.as_bytes())), TOKEN_MARKER);
    // `eyJ` alone, or without three parts, is not a token.
    assert_eq!(text(redact(b"eyJust text. ok")), "eyJust text. ok");
}

#[test]
fn several_findings_in_one_line_all_go() {
    let line = format!("a {KEY} b {} c eyJh.eyJi.sig d", b64(KEY));
    let out = text(redact(line.as_bytes()));
    assert_eq!(
        out,
        format!("a {PEM_MARKER}\n b {BASE64_PEM_MARKER} c {TOKEN_MARKER} d")
    );
}

#[test]
fn the_writer_redacts_an_event_written_in_pieces() {
    let mut sink = Vec::new();
    {
        let mut w = RedactingWriter::new(&mut sink);
        w.write_all(b"first -----BEG").unwrap();
        w.write_all(b"IN CERTIFICATE-----\nMIIB\n").unwrap();
        w.write_all(b"\" tail\n").unwrap();
    }
    assert_eq!(
        String::from_utf8(sink).unwrap(),
        format!("first {PEM_MARKER}\" tail\n")
    );
}

#[test]
fn only_the_body_echoing_module_is_dropped() {
    assert!(drops_target("kube_client::client"));
    assert!(!drops_target("kube_client::client::builder"));
    assert!(!drops_target("kube_client::client::tls"));
    assert!(!drops_target("controller::ca"));
}
