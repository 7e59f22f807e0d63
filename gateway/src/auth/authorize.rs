//! What a [`Caller`] may do. Viewers read jobs of their tenants; members also submit and cancel
//! jobs of their tenants; admins do everything in every tenant. A refusal names what was
//! missing and is logged with the subject.

use std::collections::BTreeSet;

use super::{Caller, Role};

/// A refused call: who, what, and what was missing (a 403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subject} may not {action}: {missing}")]
pub struct Denied {
    /// The caller's subject.
    pub subject: String,
    /// What it tried, e.g. `cancel job j-1 of tenant vision`.
    pub action: String,
    /// What it lacks, e.g. `needs role member in tenant vision; alice is viewer in nlp`.
    pub missing: String,
}

impl Caller {
    /// Whether the caller has at least `role` in `tenant`.
    pub fn may(&self, role: Role, tenant: &str) -> bool {
        self.is_admin() || (self.role >= role && self.tenants.contains(tenant))
    }

    /// `Ok` when the caller has at least `role` in `tenant`; otherwise a logged [`Denied`] for
    /// `action` (a phrase such as `cancel job j-1 of tenant vision`).
    pub fn require(&self, role: Role, tenant: &str, action: impl FnOnce() -> String) -> Result<(), Denied> {
        if self.may(role, tenant) {
            return Ok(());
        }
        Err(self.deny(action(), format!("needs role {role} in tenant {tenant}; {}", self.holds())))
    }

    /// `Ok` for an admin; otherwise a logged [`Denied`] for `action`.
    pub fn require_admin(&self, action: impl FnOnce() -> String) -> Result<(), Denied> {
        if self.is_admin() {
            return Ok(());
        }
        Err(self.deny(action(), format!("needs role admin; {}", self.holds())))
    }

    /// The tenants a list may show without a tenant filter: `None` for all (an admin), else the
    /// caller's own tenants.
    pub fn visible_tenants(&self) -> Option<BTreeSet<String>> {
        (!self.is_admin()).then(|| self.tenants.clone())
    }

    /// What the caller holds, for refusals: `alice is viewer in nlp, vision`.
    fn holds(&self) -> String {
        let tenants: Vec<&str> = self.tenants.iter().map(String::as_str).collect();
        format!(
            "{} is {} in {}",
            self.subject,
            self.role,
            if tenants.is_empty() { "no tenant".into() } else { tenants.join(", ") }
        )
    }

    fn deny(&self, action: String, missing: String) -> Denied {
        tracing::warn!(subject = %self.subject, role = %self.role, %action, %missing, "request denied");
        Denied { subject: self.subject.clone(), action, missing }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn caller(role: Role, tenants: &[&str]) -> Caller {
        Caller { subject: "alice".into(), role, tenants: tenants.iter().map(|t| t.to_string()).collect() }
    }

    #[test]
    fn members_act_only_in_their_tenants() {
        let alice = caller(Role::Member, &["vision"]);
        assert!(alice.require(Role::Member, "vision", || "submit".into()).is_ok());
        assert!(alice.require(Role::Viewer, "vision", || "read".into()).is_ok());
        let denied = alice.require(Role::Member, "nlp", || "cancel job j-1 of tenant nlp".into()).unwrap_err();
        assert_eq!(
            denied.to_string(),
            "alice may not cancel job j-1 of tenant nlp: needs role member in tenant nlp; alice is member in vision"
        );
    }

    #[test]
    fn viewers_read_but_do_not_change() {
        let viewer = caller(Role::Viewer, &["vision"]);
        assert!(viewer.may(Role::Viewer, "vision"));
        assert!(!viewer.may(Role::Member, "vision"));
        assert!(!viewer.may(Role::Viewer, "nlp"));
        assert!(viewer.require_admin(|| "manage quotas".into()).unwrap_err().missing.contains("needs role admin"));
    }

    #[test]
    fn admins_act_everywhere_and_see_every_tenant() {
        let admin = caller(Role::Admin, &[]);
        assert!(admin.may(Role::Member, "any-tenant"));
        assert!(admin.visible_tenants().is_none());
        assert_eq!(caller(Role::Viewer, &["a", "b"]).visible_tenants().unwrap().len(), 2);
    }
}
