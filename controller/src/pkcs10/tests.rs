//! The parser never panics, whatever the bytes: proptests over mutated
//! DER and PEM of a valid request and over random bytes (the fuzz example
//! runs the same mutations at scale). What each malformed request is denied
//! for is asserted through the whole validation in `validate/tests.rs`.

use proptest::prelude::*;

use super::*;
use crate::fixtures::mutate;
use crate::validate::tests::{der_of, p256, request};

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn inspect_never_panics_on_mutated_der(ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..6)) {
        let der = der_of(&request(p256()));
        let policy = Policy::default();
        let _ = inspect_der(&mutate(&der, &ops), &policy);
    }

    #[test]
    fn inspect_never_panics_on_mutated_pem(ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..4)) {
        let pem_bytes = request(p256());
        let policy = Policy::default();
        let _ = inspect_request(&mutate(&pem_bytes, &ops), &policy);
    }

    #[test]
    fn inspect_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = inspect_der(&bytes, &Policy::default());
    }
}
