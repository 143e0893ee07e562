//! [`Timestamp`]: a UTC instant with one textual form.
//!
//! Signed documents must encode the same instant as the same bytes, so a
//! timestamp is always `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, UTC, whole seconds)
//! and nothing else is accepted on decode. Sub-second precision is dropped on
//! construction: no decision in this project needs it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A UTC instant with whole-second precision, serialised as
/// `YYYY-MM-DDTHH:MM:SSZ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Timestamp(i64);

impl Timestamp {
    /// From seconds since the Unix epoch. Fails outside years 0000..=9999,
    /// which RFC 3339 cannot express.
    pub fn from_unix(secs: i64) -> Result<Self> {
        // 0000-01-01T00:00:00Z .. 9999-12-31T23:59:59Z
        const MIN: i64 = -62_167_219_200;
        const MAX: i64 = 253_402_300_799;
        if !(MIN..=MAX).contains(&secs) {
            return Err(Error::invalid_value(
                "timestamp",
                "outside years 0000..=9999",
            ));
        }
        Ok(Timestamp(secs))
    }

    /// From a chrono instant, truncating sub-second precision.
    pub fn from_datetime(dt: DateTime<Utc>) -> Result<Self> {
        Self::from_unix(dt.timestamp())
    }

    /// Seconds since the Unix epoch.
    pub fn unix(self) -> i64 {
        self.0
    }

    /// As a chrono instant.
    pub fn to_datetime(self) -> DateTime<Utc> {
        // from_unix bounds the value to a range chrono represents.
        Utc.timestamp_opt(self.0, 0)
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// This instant plus `secs` seconds (saturating at the representable
    /// range).
    pub fn plus_secs(self, secs: i64) -> Timestamp {
        Timestamp::from_unix(self.0.saturating_add(secs)).unwrap_or(self)
    }

    /// Signed difference `self - earlier` in seconds.
    pub fn secs_since(self, earlier: Timestamp) -> i64 {
        self.0 - earlier.0
    }
}

impl FromStr for Timestamp {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let dt = DateTime::parse_from_rfc3339(s)
            .map_err(|e| Error::invalid_value("timestamp", e))?
            .with_timezone(&Utc);
        let ts = Timestamp::from_datetime(dt)?;
        // One instant, one spelling: reject offsets, fractions, lowercase.
        if ts.to_string() != s {
            return Err(Error::invalid_value(
                "timestamp",
                "must be YYYY-MM-DDTHH:MM:SSZ (UTC, whole seconds)",
            ));
        }
        Ok(ts)
    }
}

impl TryFrom<String> for Timestamp {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Timestamp> for String {
    fn from(t: Timestamp) -> String {
        t.to_string()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            &self
                .to_datetime()
                .to_rfc3339_opts(SecondsFormat::Secs, true),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spelling_only() {
        let t: Timestamp = "2025-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(t.to_string(), "2025-01-02T03:04:05Z");
        for bad in [
            "2025-01-02T03:04:05+00:00",
            "2025-01-02T03:04:05.5Z",
            "2025-01-02t03:04:05z",
            "2025-01-02 03:04:05Z",
            "",
        ] {
            assert!(bad.parse::<Timestamp>().is_err(), "{bad}");
        }
    }

    #[test]
    fn bounds() {
        assert!(Timestamp::from_unix(i64::MAX).is_err());
        assert_eq!(
            Timestamp::from_unix(0).unwrap().to_string(),
            "1970-01-01T00:00:00Z"
        );
    }
}
