use super::*;
use crate::resources::find;

fn def(group: &str, plural: &str) -> &'static ResourceDef {
    &RESOURCES[find(group, "v1", plural).unwrap()]
}

fn fields(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.field.as_str()).collect()
}

#[test]
fn signer_names_are_qualified_domain_and_path() {
    for ok in [
        "kubeovn.io/signer",
        "kubernetes.io/kube-apiserver-client",
        "example.com/ns.name",
    ] {
        assert_eq!(signer_name_errors("f", ok), [], "{ok}");
    }
    for bad in [
        "kubeovn.io/signer ",
        " kubeovn.io/signer",
        "kubeovn.io/Signer",
        "kubeovn/signer",
        "kubeovn.io/",
        "kubeovn.io",
        "a.io/b/c",
        "kubeovn..io/signer",
    ] {
        let errs = signer_name_errors("spec.signerName", bad);
        assert!(!errs.is_empty(), "{bad:?} accepted");
        assert!(errs.iter().all(|e| e.field == "spec.signerName"));
    }
    let errs = signer_name_errors("spec.signerName", "kubeovn.io/signer ");
    assert_eq!(
        errs[0].to_string(),
        "spec.signerName: Invalid value: \"signer \": validating label \"signer \": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    );
    assert_eq!(
        signer_name_errors("f", "")[0].kind,
        FieldErrorKind::Required
    );
}

#[test]
fn name_formats_follow_apimachinery() {
    assert_eq!(is_dns1123_subdomain("a.b-c.d"), Vec::<String>::new());
    for bad in ["a..b", "a.-b", "-a", "a-", "A", "a_b", ""] {
        assert!(!is_dns1123_subdomain(bad).is_empty(), "{bad:?}");
    }
    assert_eq!(is_dns1123_label("a.b"), ["must not contain dots"]);
    assert_eq!(is_dns1123_label(&"a".repeat(63)), Vec::<String>::new());
    assert!(!is_dns1123_label(&"a".repeat(64)).is_empty());
    assert_eq!(is_path_segment_name("system:node"), Vec::<String>::new());
    assert_eq!(is_path_segment_name(".."), ["may not be '..'"]);
    assert_eq!(
        is_path_segment_name("a/b%"),
        ["may not contain '/'", "may not contain '%'"]
    );
    assert_eq!(
        is_qualified_name("kubernetes.io/Metadata_name.1"),
        Vec::<String>::new()
    );
    assert_eq!(is_qualified_name("/x"), ["prefix part must be non-empty"]);
    assert!(is_qualified_name("a/b/c")[0].starts_with("a qualified name must consist"));
    assert!(is_qualified_name("x/")[0].starts_with("name part must be non-empty"));
    assert!(
        !is_qualified_name("Ex.com/x").is_empty(),
        "upper-case prefix"
    );
    assert_eq!(is_valid_label_value(""), Vec::<String>::new());
    assert!(!is_valid_label_value("a b").is_empty());
    assert_eq!(is_config_map_key("KEY_name-1.txt"), Vec::<String>::new());
    assert_eq!(is_config_map_key(".."), ["must not be '..'"]);
    assert_eq!(is_config_map_key("..a"), ["must not start with '..'"]);
    assert!(is_config_map_key("a b")[0].starts_with("a valid config key must consist"));
}

#[test]
fn decoding_refuses_wrong_types_with_gos_message() {
    let cm = def("", "configmaps");
    let mut obj = json!({"metadata": {"name": "x"}, "data": {"a": {"b": 1}}});
    assert_eq!(
        decode(cm, &mut obj).unwrap_err(),
        "json: cannot unmarshal object into Go struct field ConfigMap.data of type string"
    );
    let mut obj = json!({"data": ["a"]});
    assert_eq!(
        decode(cm, &mut obj).unwrap_err(),
        "json: cannot unmarshal array into Go struct field ConfigMap.data of type map[string]string"
    );
    let mut obj = json!({"binaryData": {"a": "not base64!"}});
    assert_eq!(
        decode(cm, &mut obj).unwrap_err(),
        "illegal base64 data at input byte 3"
    );
    let mut obj = json!({"metadata": {"labels": {"a": 1}}});
    assert_eq!(
        decode(cm, &mut obj).unwrap_err(),
        "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"
    );
    let mut obj = json!({"metadata": "x"});
    assert!(decode(cm, &mut obj).unwrap_err().contains("v1.ObjectMeta"));
    let secret = def("", "secrets");
    let mut obj = json!({"data": {"a": 1}});
    assert_eq!(
        decode(secret, &mut obj).unwrap_err(),
        "json: cannot unmarshal number into Go struct field Secret.data of type []uint8"
    );
    // Go's []byte: padding required, line breaks skipped, trailing bits
    // not checked.
    for ok in ["", "YQ==", "YR==", "YWJj\nZGVm"] {
        let mut obj = json!({"data": {"a": ok}});
        assert_eq!(decode(secret, &mut obj), Ok(()), "{ok:?}");
    }
    for bad in ["YQ", "Y", "YQ=", "@@@@"] {
        let mut obj = json!({"data": {"a": bad}});
        assert!(decode(secret, &mut obj).is_err(), "{bad:?}");
    }
    let lease = def("coordination.k8s.io", "leases");
    let mut obj = json!({"spec": {"leaseDurationSeconds": 1.5}});
    assert_eq!(
        decode(lease, &mut obj).unwrap_err(),
        "json: cannot unmarshal number 1.5 into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32"
    );
    let mut obj = json!({"spec": {"leaseDurationSeconds": 4_294_967_296_i64}});
    assert!(decode(lease, &mut obj).is_err());
    // Custom resources are their CRD's business.
    let cr = def("cert-manager.io", "certificaterequests");
    assert_eq!(decode(cr, &mut json!({"metadata": {"labels": 1}})), Ok(()));
}

#[test]
fn decoding_turns_null_elements_into_empty_strings() {
    let mut obj = json!({"metadata": {"labels": {"a": null}, "finalizers": [null]},
                         "data": {"k": null}, "binaryData": null});
    decode(def("", "configmaps"), &mut obj).unwrap();
    assert_eq!(
        obj,
        json!({"metadata": {"labels": {"a": ""}, "finalizers": [""]},
               "data": {"k": ""}, "binaryData": null})
    );
}

#[test]
fn config_maps_and_secrets_as_the_real_server() {
    let cm = def("", "configmaps");
    let obj = json!({"metadata": {"name": "x"}, "data": {"a b": "1", "k": "2"},
                     "binaryData": {"k": "MQ=="}});
    assert_eq!(fields(&validate(cm, &obj, None)), ["data[a b]", "data[k]"]);
    let big = json!({"metadata": {"name": "x"}, "data": {"a": "x".repeat(MAX_DATA_SIZE + 1)}});
    let errs = validate(cm, &big, None);
    assert_eq!(
        errs[0].to_string(),
        ": Too long: may not be more than 1048576 bytes"
    );
    let frozen = json!({"metadata": {"name": "x"}, "data": {"a": "1"}, "immutable": true});
    let thawed = json!({"metadata": {"name": "x"}, "data": {"a": "2"}});
    assert_eq!(
        fields(&validate(cm, &thawed, Some(&frozen))),
        ["immutable", "data"]
    );

    let secret = def("", "secrets");
    let tls =
        json!({"metadata": {"name": "x"}, "type": "kubernetes.io/tls", "data": {"tls.crt": ""}});
    let errs = validate(secret, &tls, None);
    assert_eq!(errs[0].to_string(), "data[tls.key]: Required value");
    let opaque = json!({"metadata": {"name": "x"}, "type": "Opaque", "data": {"tls.crt": ""}});
    let errs = validate(secret, &opaque, Some(&tls));
    assert_eq!(
        errs[0].to_string(),
        "type: Invalid value: \"Opaque\": field is immutable"
    );
    // The size is of the decoded bytes.
    let encoded = "QUFB".repeat(MAX_DATA_SIZE / 3);
    let at_limit = json!({"metadata": {"name": "x"}, "type": "Opaque", "data": {"a": encoded}});
    assert_eq!(validate(secret, &at_limit, None), []);
}

#[test]
fn metadata_of_every_kind() {
    let ns = def("", "namespaces");
    let errs = validate(ns, &json!({"metadata": {"name": "a.b"}}), None);
    assert_eq!(
        errs[0].to_string(),
        "metadata.name: Invalid value: \"a.b\": must not contain dots"
    );
    let node = def("", "nodes");
    assert_eq!(
        validate(node, &json!({"metadata": {"name": "a.b"}}), None),
        []
    );
    // A name is only judged on create: it cannot change afterwards.
    let old = json!({"metadata": {"name": "a.b"}});
    assert_eq!(validate(ns, &old, Some(&old)), []);
    let csr = def("certificates.k8s.io", "certificatesigningrequests");
    let named = |name: &str| {
        let errs = validate(csr, &json!({"metadata": {"name": name}}), None);
        errs.iter().any(|e| e.field == "metadata.name")
    };
    assert!(!named("node-csr-Ab_9"), "a CSR may be called anything");
    assert!(named("a/b"));
    let pod = json!({"metadata": {"name": "p",
        "labels": {"app": "x", "bad key": "v", "k": "bad value"},
        "annotations": {"Example.COM/Key": "v", "no/pe/x": "v"},
        "finalizers": ["example.com/f", "not valid"],
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true},
            {"apiVersion": "apps/", "kind": "", "name": "e", "uid": "v", "controller": true}]}});
    let errs = validate(def("", "pods"), &pod, None);
    assert_eq!(
        fields(&errs),
        [
            "metadata.labels",
            "metadata.labels",
            "metadata.annotations",
            "metadata.finalizers",
            "metadata.ownerReferences.apiVersion",
            "metadata.ownerReferences.kind",
            "metadata.ownerReferences",
        ]
    );
    let big =
        json!({"metadata": {"name": "p", "annotations": {"a": "x".repeat(MAX_ANNOTATIONS_SIZE)}}});
    assert_eq!(
        validate(def("", "pods"), &big, None)[0].to_string(),
        "metadata.annotations: Too long: may not be more than 262144 bytes"
    );
    let deleting =
        json!({"metadata": {"name": "p", "deletionTimestamp": "t", "finalizers": ["a.io/x"]}});
    let more = json!({"metadata": {"name": "p", "deletionTimestamp": "t", "finalizers": ["a.io/x", "a.io/y"]}});
    assert_eq!(
        validate(def("", "pods"), &more, Some(&deleting))[0].to_string(),
        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"a.io/y\"}"
    );
}

#[test]
fn csr_usages_signer_and_request() {
    let csr = def("certificates.k8s.io", "certificatesigningrequests");
    let request = base64::engine::general_purpose::STANDARD
        .encode("-----BEGIN CERTIFICATE REQUEST-----\nx\n-----END CERTIFICATE REQUEST-----\n");
    let obj = json!({"metadata": {"name": "c"}, "spec": {"request": request,
        "signerName": "kubeovn.io/signer", "usages": ["ipsec tunnel", "frobnicate", "ipsec tunnel"],
        "expirationSeconds": 599}});
    let errs = validate(csr, &obj, None);
    assert_eq!(
        fields(&errs),
        ["spec.usages[1]", "spec.usages[2]", "spec.expirationSeconds"]
    );
    assert_eq!(errs[0].kind, FieldErrorKind::NotSupported);
    assert!(
        errs[0]
            .body()
            .starts_with("Unsupported value: \"frobnicate\": supported values: \"any\", ")
    );
    assert_eq!(
        errs[1].to_string(),
        "spec.usages[2]: Duplicate value: \"ipsec tunnel\""
    );
    let empty = json!({"metadata": {"name": "c"}, "spec": {}});
    assert_eq!(
        fields(&validate(csr, &empty, None)),
        ["spec.request", "spec.usages", "spec.signerName"]
    );
}

#[test]
fn lease_durations() {
    let lease = def("coordination.k8s.io", "leases");
    let obj = json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0, "leaseTransitions": -1}});
    let errs = validate(lease, &obj, None);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
            "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0"
        ]
    );
}
