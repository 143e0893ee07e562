//! The kernel's XFRM error counters, `/proc/net/xfrm_stat` of one network
//! namespace (one `Name<whitespace>value` line per counter). Pure parsing:
//! the reader opens the file in the namespace it cares about (`/proc/net`
//! is the reading process's namespace).
//!
//! The counters are how the data path shows what the policies alone do not:
//! `XfrmOutPolBlock` grows when the guards drop marked packets that no
//! IPsec policy with an SA claimed (the IKE daemon down, no CHILD_SA),
//! `XfrmInNoStates` when ESP arrives for an SA this node no longer has.

use std::collections::BTreeMap;

/// Outbound packets dropped by a `block` policy — the guards' drops.
pub const OUT_POL_BLOCK: &str = "XfrmOutPolBlock";
/// Outbound packets with a matching policy but no usable state.
pub const OUT_NO_STATES: &str = "XfrmOutNoStates";
/// Inbound ESP for which no state exists.
pub const IN_NO_STATES: &str = "XfrmInNoStates";
/// Inbound packets that needed a policy's SA but arrived without one.
pub const IN_TMPL_MISMATCH: &str = "XfrmInTmplMismatch";

/// One reading of the counters, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XfrmStats(BTreeMap<String, u64>);

/// Why a counters file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("xfrm_stat line {line}: {reason}")]
pub struct StatError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl XfrmStats {
    /// Parses the text of `/proc/net/xfrm_stat`. A line that is not a name
    /// and an unsigned number is an error (naming the line) rather than a
    /// silently missing counter; blank lines are ignored.
    pub fn parse(text: &str) -> Result<Self, StatError> {
        let mut out = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let mut fields = line.split_whitespace();
            let Some(name) = fields.next() else {
                continue;
            };
            let err = |reason: String| StatError {
                line: i + 1,
                reason,
            };
            let value = fields
                .next()
                .ok_or_else(|| err(format!("{name} has no value")))?;
            let value = value
                .parse::<u64>()
                .map_err(|_| err(format!("{name} value {value:?} is not a counter")))?;
            if fields.next().is_some() {
                return Err(err(format!("{name} has more than one value")));
            }
            out.insert(name.to_string(), value);
        }
        Ok(Self(out))
    }

    /// The counter `name`, 0 when the kernel does not report it.
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// How much each counter grew since `earlier`, only those that did (a
    /// counter that went down — a namespace recreated — counts from 0).
    pub fn growth_since(&self, earlier: &XfrmStats) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .filter_map(|(name, now)| {
                let before = earlier.get(name);
                let grew = if *now >= before { now - before } else { *now };
                (grew > 0).then(|| (name.clone(), grew))
            })
            .collect()
    }

    /// Every counter, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "XfrmInError             \t0\nXfrmInNoStates          \t3\n\
                          XfrmOutPolBlock         \t12\nXfrmOutNoStates         \t0\n";

    #[test]
    fn parses_the_kernel_format() {
        let s = XfrmStats::parse(SAMPLE).unwrap();
        assert_eq!(s.get(OUT_POL_BLOCK), 12);
        assert_eq!(s.get(IN_NO_STATES), 3);
        assert_eq!(s.get("XfrmFwdHdrError"), 0);
        assert_eq!(s.iter().count(), 4);
    }

    #[test]
    fn growth_names_only_what_grew() {
        let before = XfrmStats::parse(SAMPLE).unwrap();
        let after = XfrmStats::parse(
            "XfrmInError 0\nXfrmInNoStates 3\nXfrmOutPolBlock 20\nXfrmOutNoStates 1\n",
        )
        .unwrap();
        let g = after.growth_since(&before);
        assert_eq!(g.len(), 2);
        assert_eq!(g[OUT_POL_BLOCK], 8);
        assert_eq!(g[OUT_NO_STATES], 1);
        // A reset counter counts from zero, never underflows.
        assert_eq!(before.growth_since(&after)[OUT_POL_BLOCK], 12);
    }

    #[test]
    fn malformed_lines_are_named() {
        let e = XfrmStats::parse("XfrmInError 0\nXfrmOutPolBlock -1\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("XfrmOutPolBlock"), "{e}");
        assert!(XfrmStats::parse("XfrmInError\n").is_err());
        assert!(XfrmStats::parse("XfrmInError 1 2\n").is_err());
        assert_eq!(XfrmStats::parse("\n\n").unwrap(), XfrmStats::default());
    }
}
