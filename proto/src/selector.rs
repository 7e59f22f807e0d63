//! Label selectors (`project=llm,type!=eval`) for `GET /v1/jobs?selector=...`,
//! `meridian jobs -l ...`, and the job spec's `placement.clusterSelector` and
//! `placement.nodeSelector`.
//!
//! The syntax is Kubernetes' equality-based one: comma-separated requirements, all of which must
//! hold.
//!
//! | requirement            | matches a job whose labels...                       |
//! |------------------------|-----------------------------------------------------|
//! | `key=value`, `key==value` | have `key` set to `value`                        |
//! | `key!=value`           | do not have `key` set to `value` (absent `key` matches) |
//! | `key`                  | have `key`, with any value                          |
//! | `!key`                 | do not have `key`                                   |
//!
//! Keys follow the label-key rules of the job spec ([`is_label_key`]); values are up to 63
//! letters, digits, `-`, `_`, `.` and may be empty (`key=` matches `key` set to the empty value).
//! Whitespace around keys, operators and values is ignored. The empty selector matches every job.
//!
//! ```
//! use std::collections::BTreeMap;
//! use meridian_proto::selector::Selector;
//!
//! let selector: Selector = "project = llm, type!=eval, !draft".parse()?;
//! let labels = BTreeMap::from([("project".to_string(), "llm".to_string())]);
//! assert!(selector.matches(&labels));
//! assert_eq!(selector.to_string(), "project=llm,type!=eval,!draft");
//! # Ok::<(), meridian_proto::selector::SelectorError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::names::{is_label_key, is_label_value};

/// A parsed label selector: every requirement must hold. The default (empty) selector matches
/// everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One condition on one label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Requirement {
    /// `key=value` (or `key==value`): the label is present with exactly this value.
    Equals {
        /// Label key.
        key: String,
        /// Required value (may be empty).
        value: String,
    },
    /// `key!=value`: the label is absent or has another value.
    NotEquals {
        /// Label key.
        key: String,
        /// Excluded value (may be empty).
        value: String,
    },
    /// `key`: the label is present, with any value.
    Exists(String),
    /// `!key`: the label is absent.
    DoesNotExist(String),
}

/// The operator of a [`Requirement`], for backends that translate a selector into their own
/// syntax (Slurm `--constraint`, Kubernetes node affinity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value`: the label is present with exactly the value.
    Equals,
    /// `key!=value`: the label is absent or has another value.
    NotEquals,
    /// `key`: the label is present (any value).
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
}

/// Why a selector was not understood: which requirement (1-based position and its text) and what
/// is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("requirement {position} `{requirement}`: {problem}")]
pub struct SelectorError {
    /// 1-based position of the requirement among the comma-separated ones.
    pub position: usize,
    /// The requirement's text, trimmed.
    pub requirement: String,
    /// What is wrong with it.
    pub problem: SelectorProblem,
}

/// What is wrong with one requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorProblem {
    /// Nothing between two commas, or a leading or trailing comma.
    #[error("empty requirement; remove the extra comma")]
    Empty,
    /// An operator with nothing before it (`=llm`).
    #[error("no label key before the operator; write `key=value`")]
    MissingKey,
    /// The key breaks the label-key rules.
    #[error(
        "`{0}` is not a valid label key: use 1-63 characters of letters, digits, `-`, `_`, `.`, `/`, \
         starting with a letter or digit"
    )]
    InvalidKey(String),
    /// The value breaks the label-value rules.
    #[error("`{0}` is not a valid label value: use up to 63 characters of letters, digits, `-`, `_`, `.`")]
    InvalidValue(String),
    /// A `!` that neither starts the requirement nor is followed by `=`.
    #[error("`!` either starts a requirement (`!key`) or is part of `!=` (`key!=value`)")]
    StrayBang,
    /// `!key=value`: a "does not exist" test given a value.
    #[error("`!key` only tests that a label is absent and takes no value; to exclude a value write `key!=value`")]
    ValueAfterNot,
}

impl Selector {
    /// The selector that matches every job (same as parsing an empty string).
    pub fn everything() -> Self {
        Self::default()
    }

    /// A selector from already-built requirements (all must hold).
    pub fn new(requirements: Vec<Requirement>) -> Self {
        Self { requirements }
    }

    /// Whether the selector has no requirements and so matches every job.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Every requirement as `(key, operator, value)`; the value is `None` for
    /// [`Operator::Exists`] and [`Operator::DoesNotExist`]. In the order written.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Operator, Option<&str>)> {
        self.requirements.iter().map(|r| (r.key(), r.operator(), r.value()))
    }

    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|requirement| requirement.matches(labels))
    }

    /// Whether the labels that `label` looks up (key → value, `None` when absent) meet every
    /// requirement. For label sets that are not one map, such as a cluster's configured labels
    /// plus its implicit `meridian.io/*` ones, without building a map.
    pub fn matches_by<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|requirement| requirement.matches_value(label(requirement.key())))
    }
}

impl Requirement {
    /// The label key the requirement tests.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals { key, .. }
            | Requirement::NotEquals { key, .. }
            | Requirement::Exists(key)
            | Requirement::DoesNotExist(key) => key,
        }
    }

    /// The requirement's operator.
    pub fn operator(&self) -> Operator {
        match self {
            Requirement::Equals { .. } => Operator::Equals,
            Requirement::NotEquals { .. } => Operator::NotEquals,
            Requirement::Exists(_) => Operator::Exists,
            Requirement::DoesNotExist(_) => Operator::DoesNotExist,
        }
    }

    /// The value compared against, for `=` and `!=`; None for `key` and `!key`.
    pub fn value(&self) -> Option<&str> {
        match self {
            Requirement::Equals { value, .. } | Requirement::NotEquals { value, .. } => Some(value),
            Requirement::Exists(_) | Requirement::DoesNotExist(_) => None,
        }
    }

    /// Whether `labels` meet this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(self.key()).map(String::as_str))
    }

    /// Whether a label whose value is `actual` (None: absent) meets this requirement.
    pub fn matches_value(&self, actual: Option<&str>) -> bool {
        match self {
            Requirement::Equals { value, .. } => actual == Some(value.as_str()),
            Requirement::NotEquals { value, .. } => actual != Some(value.as_str()),
            Requirement::Exists(_) => actual.is_some(),
            Requirement::DoesNotExist(_) => actual.is_none(),
        }
    }

    fn parse(text: &str) -> Result<Self, SelectorProblem> {
        if text.is_empty() {
            return Err(SelectorProblem::Empty);
        }
        // `!=value` is a missing key, not a `!key` test.
        if let Some(rest) = text.strip_prefix('!').filter(|_| !text.starts_with("!=")) {
            let key = rest.trim();
            if key.contains(['=', '!']) {
                return Err(SelectorProblem::ValueAfterNot);
            }
            return Ok(Requirement::DoesNotExist(checked_key(key)?));
        }
        let Some(op_start) = text.find(['=', '!']) else {
            return Ok(Requirement::Exists(checked_key(text)?));
        };
        let (key, rest) = text.split_at(op_start);
        let key = key.trim();
        if key.is_empty() {
            return Err(SelectorProblem::MissingKey);
        }
        let key = checked_key(key)?;
        if let Some(value) = rest.strip_prefix("!=") {
            Ok(Requirement::NotEquals { key, value: checked_value(value.trim())? })
        } else if let Some(value) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
            Ok(Requirement::Equals { key, value: checked_value(value.trim())? })
        } else {
            Err(SelectorProblem::StrayBang)
        }
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    /// Parses a comma-separated list of requirements; an empty (or blank) string is the selector
    /// that matches everything. The first bad requirement is reported with its position.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Ok(Self::everything());
        }
        let requirements = text
            .split(',')
            .map(str::trim)
            .enumerate()
            .map(|(i, requirement)| {
                Requirement::parse(requirement).map_err(|problem| SelectorError {
                    position: i + 1,
                    requirement: requirement.to_string(),
                    problem,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { requirements })
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Equals { key, value } => write!(f, "{key}={value}"),
            Requirement::NotEquals { key, value } => write!(f, "{key}!={value}"),
            Requirement::Exists(key) => f.write_str(key),
            Requirement::DoesNotExist(key) => write!(f, "!{key}"),
        }
    }
}

impl fmt::Display for Selector {
    /// The canonical text (`key=value,key!=value,key,!key`, no spaces), which parses back to an
    /// equal selector.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

impl Serialize for Selector {
    /// As its canonical text (see [`Display`](fmt::Display)).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Selector {
    /// From selector text (`gpu-fabric=ib,!preemptible`), or from a map of labels
    /// (`{gpu-fabric: ib}`, as Kubernetes writes `nodeSelector`), each entry an equality
    /// requirement. A bad requirement fails with [`SelectorError`]'s message.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SelectorVisitor;
        impl<'de> Visitor<'de> for SelectorVisitor {
            type Value = Selector;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a label selector such as `gpu-fabric=ib,!preemptible`, or a map of labels")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Selector, E> {
                text.parse().map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Selector, A::Error> {
                let mut requirements = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, String>()? {
                    let position = requirements.len() + 1;
                    let requirement = format!("{key}={value}");
                    let checked = checked_key(&key)
                        .and_then(|key| Ok(Requirement::Equals { key, value: checked_value(&value)? }));
                    requirements.push(
                        checked
                            .map_err(|problem| de::Error::custom(SelectorError { position, requirement, problem }))?,
                    );
                }
                Ok(Selector::new(requirements))
            }
        }
        deserializer.deserialize_any(SelectorVisitor)
    }
}

fn checked_key(key: &str) -> Result<String, SelectorProblem> {
    if is_label_key(key) { Ok(key.to_string()) } else { Err(SelectorProblem::InvalidKey(key.to_string())) }
}

/// Same rule as label values in the job spec (`validate.rs`).
fn checked_value(value: &str) -> Result<String, SelectorProblem> {
    if is_label_value(value) { Ok(value.to_string()) } else { Err(SelectorProblem::InvalidValue(value.to_string())) }
}

#[cfg(test)]
// Panicking on an unexpected result is how a test fails; the workspace lint targets library code.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn parse(text: &str) -> Selector {
        text.parse().unwrap()
    }

    fn problem(text: &str) -> (usize, SelectorProblem) {
        let err = text.parse::<Selector>().unwrap_err();
        (err.position, err.problem)
    }

    #[test]
    fn every_operator_parses() {
        let selector = parse("a=1,b==2,c!=3,d,!e");
        assert_eq!(
            selector.requirements(),
            &[
                Requirement::Equals { key: "a".into(), value: "1".into() },
                Requirement::Equals { key: "b".into(), value: "2".into() },
                Requirement::NotEquals { key: "c".into(), value: "3".into() },
                Requirement::Exists("d".into()),
                Requirement::DoesNotExist("e".into()),
            ]
        );
    }

    #[test]
    fn whitespace_around_tokens_is_ignored() {
        assert_eq!(
            parse("  project = llm ,  type != eval , ! draft , team "),
            parse("project=llm,type!=eval,!draft,team")
        );
    }

    #[test]
    fn empty_selector_matches_everything() {
        for text in ["", "   "] {
            let selector = parse(text);
            assert!(selector.is_everything());
            assert!(selector.matches(&labels(&[])));
            assert!(selector.matches(&labels(&[("project", "llm")])));
            assert_eq!(selector.to_string(), "");
        }
    }

    #[test]
    fn equality_needs_the_label_with_that_value() {
        let selector = parse("project=llm");
        assert!(selector.matches(&labels(&[("project", "llm"), ("type", "eval")])));
        assert!(!selector.matches(&labels(&[("project", "vision")])));
        assert!(!selector.matches(&labels(&[])));
    }

    #[test]
    fn inequality_also_matches_an_absent_label() {
        let selector = parse("type!=eval");
        assert!(selector.matches(&labels(&[("type", "train")])));
        assert!(selector.matches(&labels(&[])));
        assert!(!selector.matches(&labels(&[("type", "eval")])));
    }

    #[test]
    fn existence_tests_ignore_the_value() {
        assert!(parse("team").matches(&labels(&[("team", "")])));
        assert!(!parse("team").matches(&labels(&[("project", "llm")])));
        assert!(parse("!team").matches(&labels(&[("project", "llm")])));
        assert!(!parse("!team").matches(&labels(&[("team", "a")])));
    }

    #[test]
    fn empty_value_matches_only_an_empty_label() {
        let selector = parse("team=");
        assert!(selector.matches(&labels(&[("team", "")])));
        assert!(!selector.matches(&labels(&[("team", "a")])));
        assert!(!selector.matches(&labels(&[])));
        assert_eq!(selector.to_string(), "team=");
    }

    #[test]
    fn all_requirements_must_hold() {
        let selector = parse("project=llm,type!=eval");
        assert!(selector.matches(&labels(&[("project", "llm"), ("type", "train")])));
        assert!(!selector.matches(&labels(&[("project", "llm"), ("type", "eval")])));
    }

    #[test]
    fn keys_may_carry_a_prefix() {
        assert!(parse("acme.io/team=nlp").matches(&labels(&[("acme.io/team", "nlp")])));
    }

    #[test]
    fn errors_name_the_requirement_and_the_reason() {
        let err = "project=llm,proj ect=x".parse::<Selector>().unwrap_err();
        assert_eq!(err.position, 2);
        assert_eq!(err.requirement, "proj ect=x");
        assert_eq!(err.problem, SelectorProblem::InvalidKey("proj ect".into()));
        assert!(
            err.to_string().starts_with("requirement 2 `proj ect=x`: `proj ect` is not a valid label key"),
            "{err}"
        );
    }

    #[test]
    fn each_kind_of_mistake_is_refused() {
        assert_eq!(problem("a=1,"), (2, SelectorProblem::Empty));
        assert_eq!(problem(",a=1"), (1, SelectorProblem::Empty));
        assert_eq!(problem("a=1,,b"), (2, SelectorProblem::Empty));
        assert_eq!(problem("=llm"), (1, SelectorProblem::MissingKey));
        assert_eq!(problem("!=llm"), (1, SelectorProblem::MissingKey));
        assert_eq!(problem("-a=1"), (1, SelectorProblem::InvalidKey("-a".into())));
        assert_eq!(problem(&format!("{}=1", "k".repeat(64))), (1, SelectorProblem::InvalidKey("k".repeat(64))));
        assert_eq!(problem("a=b=c"), (1, SelectorProblem::InvalidValue("b=c".into())));
        assert_eq!(problem("a===b"), (1, SelectorProblem::InvalidValue("=b".into())));
        assert_eq!(problem("a=hello world"), (1, SelectorProblem::InvalidValue("hello world".into())));
        assert_eq!(problem("a=x/y"), (1, SelectorProblem::InvalidValue("x/y".into())));
        assert_eq!(problem(&format!("a={}", "v".repeat(64))), (1, SelectorProblem::InvalidValue("v".repeat(64))));
        assert_eq!(problem("a!b"), (1, SelectorProblem::StrayBang));
        assert_eq!(problem("!a=b"), (1, SelectorProblem::ValueAfterNot));
        assert_eq!(problem("!"), (1, SelectorProblem::InvalidKey(String::new())));
    }

    #[test]
    fn longest_key_and_value_are_accepted() {
        let text = format!("{}={}", "k".repeat(63), "v".repeat(63));
        assert_eq!(parse(&text).to_string(), text);
    }

    #[test]
    fn requirements_can_be_listed_for_translation() {
        let selector = parse("a=1,b!=2,c,!d");
        let listed: Vec<_> = selector.iter().collect();
        assert_eq!(
            listed,
            vec![
                ("a", Operator::Equals, Some("1")),
                ("b", Operator::NotEquals, Some("2")),
                ("c", Operator::Exists, None),
                ("d", Operator::DoesNotExist, None),
            ]
        );
    }

    #[test]
    fn matching_by_lookup_equals_matching_a_map() {
        let map = labels(&[("a", "1"), ("c", "")]);
        for text in ["a=1", "a!=1", "c", "!c", "d", "!d", "a=1,c,!d", "c="] {
            let selector = parse(text);
            assert_eq!(selector.matches_by(|k| map.get(k).map(String::as_str)), selector.matches(&map), "{text}");
        }
    }

    #[test]
    fn serde_writes_the_canonical_text_and_reads_text_or_a_map() {
        let selector = parse(" a = 1 , !b ");
        assert_eq!(serde_json::to_value(&selector).unwrap(), serde_json::json!("a=1,!b"));
        let back: Selector = serde_json::from_value(serde_json::json!("a=1,!b")).unwrap();
        assert_eq!(back, selector);
        let from_map: Selector = serde_json::from_value(serde_json::json!({"x": "1", "y": ""})).unwrap();
        assert_eq!(from_map.to_string(), "x=1,y=");
        let err = serde_json::from_value::<Selector>(serde_json::json!("a=1,b c")).unwrap_err();
        assert!(err.to_string().contains("requirement 2 `b c`"), "{err}");
        assert!(serde_json::from_value::<Selector>(serde_json::json!(7)).is_err());
    }

    fn key() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9][a-zA-Z0-9._/-]{0,62}"
    }

    fn value() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9._-]{0,63}"
    }

    fn requirement() -> impl Strategy<Value = Requirement> {
        prop_oneof![
            (key(), value()).prop_map(|(key, value)| Requirement::Equals { key, value }),
            (key(), value()).prop_map(|(key, value)| Requirement::NotEquals { key, value }),
            key().prop_map(Requirement::Exists),
            key().prop_map(Requirement::DoesNotExist),
        ]
    }

    proptest! {
        #[test]
        fn display_parses_back_to_the_same_selector(requirements in prop::collection::vec(requirement(), 0..8)) {
            let selector = Selector::new(requirements);
            let text = selector.to_string();
            prop_assert_eq!(text.parse::<Selector>(), Ok(selector));
        }

        #[test]
        fn any_text_either_fails_cleanly_or_round_trips(text in "[a-z=!, ._/-]{0,24}") {
            if let Ok(selector) = text.parse::<Selector>() {
                prop_assert_eq!(selector.to_string().parse::<Selector>(), Ok(selector));
            }
        }
    }
}
