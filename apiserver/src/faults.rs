//! Faults a test drives into the server (the chaos suite's environment
//! faults): the next requests that match a rule answered with an error
//! code instead of being served, and every open watch dropped at once.
//!
//! The server consults [`Faults`] after authentication and authorization
//! (a fault never hides a 401 or 403) and before the verb touches the
//! store, so a faulted write changes nothing.

use std::sync::Mutex;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::ApiError;

/// Which requests a [`Rule`] answers and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`); `None`: any.
    pub verb: Option<String>,
    /// The resource's plural (`certificatesigningrequests`); `None`: any.
    pub resource: Option<String>,
    /// The answer: 409 (Conflict), 429 (TooManyRequests, `Retry-After: 1`),
    /// 503 (ServiceUnavailable) or anything else as a 500-class
    /// InternalError of that code.
    pub code: u16,
    /// How many matching requests it answers before it is spent.
    pub times: usize,
}

/// The fault switch of one server ([`crate::ApiServerBuilder::faults`]).
#[derive(Debug)]
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    watches: Mutex<CancellationToken>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            rules: Mutex::new(Vec::new()),
            watches: Mutex::new(CancellationToken::new()),
        }
    }
}

impl Faults {
    /// Adds `rule` (after the ones still pending: the first match answers).
    pub fn fail(&self, rule: Rule) {
        self.lock_rules().push(rule);
    }

    /// Drops every rule still pending.
    pub fn clear(&self) {
        self.lock_rules().clear();
    }

    /// How many faulted answers the pending rules still owe.
    pub fn pending(&self) -> usize {
        self.lock_rules().iter().map(|r| r.times).sum()
    }

    /// Ends every open watch now (the client sees its stream close and
    /// watches again); watches opened later are not affected.
    pub fn drop_watches(&self) {
        let mut w = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        w.cancel();
        *w = CancellationToken::new();
    }

    /// Resolves when [`Faults::drop_watches`] is next called: what a watch
    /// opened now ends on.
    pub(crate) fn watch_dropped(&self) -> WaitForCancellationFutureOwned {
        self.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .cancelled_owned()
    }

    /// The faulted answer to a `verb` on `resource` (object `name`), if a
    /// rule takes it; the rule is spent by one.
    pub(crate) fn take(&self, verb: &str, resource: &str, name: &str) -> Option<ApiError> {
        let mut rules = self.lock_rules();
        let i = rules.iter().position(|r| {
            r.times > 0
                && r.verb.as_deref().is_none_or(|v| v == verb)
                && r.resource.as_deref().is_none_or(|v| v == resource)
        })?;
        let code = rules[i].code;
        rules[i].times -= 1;
        if rules[i].times == 0 {
            rules.remove(i);
        }
        let why = format!("injected fault on {verb} {resource}");
        Some(match code {
            409 => ApiError::conflict_on(
                resource,
                name,
                &format!(
                    "the object has been modified; please apply your changes to the latest version and try again ({why})"
                ),
            ),
            429 => ApiError::too_many_requests(why),
            503 => ApiError::unavailable(why),
            other => ApiError::internal_code(other, why),
        })
    }

    fn lock_rules(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verb: Option<&str>, resource: Option<&str>, code: u16, times: usize) -> Rule {
        Rule {
            verb: verb.map(String::from),
            resource: resource.map(String::from),
            code,
            times,
        }
    }

    #[test]
    fn a_rule_answers_only_what_it_matches_and_only_its_count() {
        let f = Faults::default();
        f.fail(rule(Some("create"), Some("nodes"), 409, 2));
        assert!(f.take("get", "nodes", "n").is_none());
        assert!(f.take("create", "pods", "p").is_none());
        assert_eq!(f.pending(), 2);
        let e = f.take("create", "nodes", "n").unwrap();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        assert_eq!(f.take("create", "nodes", "n").unwrap().code, 409);
        assert!(f.take("create", "nodes", "n").is_none(), "spent");
        assert_eq!(f.pending(), 0);
    }

    #[test]
    fn each_code_has_its_reason() {
        let f = Faults::default();
        for code in [429, 500, 503] {
            f.fail(rule(None, None, code, 1));
        }
        let reasons: Vec<_> = (0..3)
            .map(|_| {
                let e = f.take("list", "pods", "").unwrap();
                (e.code, e.reason)
            })
            .collect();
        assert_eq!(
            reasons,
            [
                (429, "TooManyRequests"),
                (500, "InternalError"),
                (503, "ServiceUnavailable")
            ]
        );
        f.fail(rule(None, None, 500, 7));
        f.clear();
        assert!(f.take("list", "pods", "").is_none());
    }

    #[tokio::test]
    async fn dropping_watches_ends_the_open_ones_only() {
        let f = Faults::default();
        let open = f.watch_dropped();
        f.drop_watches();
        tokio::time::timeout(std::time::Duration::from_secs(1), open)
            .await
            .expect("an open watch was not dropped");
        let later = f.watch_dropped();
        tokio::pin!(later);
        assert!(
            futures::poll!(&mut later).is_pending(),
            "a watch opened after the drop ended"
        );
    }
}
