//! Names: the grammar of label keys and values (job labels, cluster labels, selectors), and of
//! cluster names.
//!
//! Cluster names: the one grammar that every place accepting a cluster name checks — an agent's
//! hello, the URI SAN of its client certificate, the agent's config and `meridian certs issue`.
//!
//! A cluster name is DNS-label-like: 1 to 63 characters, lowercase ASCII letters, digits and
//! `-`, starting with a letter and not ending with `-` (`onprem-east`, `k8s-west`, `hpc`). A
//! name ends up in file names (`cluster-NAME.pem`), URIs (`urn:meridian:cluster:NAME`), metric
//! labels, selectors (`meridian.io/cluster`) and log lines; this grammar keeps it plain in all
//! of them, so that no name can carry a path (`west/../east`), markup or a line break.

use std::fmt;

/// Longest job name, tenant, label key or label value, in characters.
pub const MAX_NAME_LEN: usize = 63;

/// Longest accepted cluster name, in characters (a DNS label's limit).
pub const MAX_CLUSTER_NAME_LEN: usize = 63;

/// The grammar in words, for error messages and documentation.
pub const CLUSTER_NAME_GRAMMAR: &str =
    "1-63 lowercase letters (a-z), digits and `-`, starting with a letter and not ending with `-`";

/// Why a cluster name breaks the grammar. Each variant says where; none repeats the whole name,
/// which may be long or hold characters that do not belong in a message. Messages read after a
/// field name or "the name": ``hello.cluster: has `/` at character 5; a cluster name is …``.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterNameError {
    /// The name is empty.
    #[error("is empty; a cluster name is {CLUSTER_NAME_GRAMMAR}")]
    Empty,
    /// The name is longer than [`MAX_CLUSTER_NAME_LEN`].
    #[error("is {length} characters long; a cluster name is {CLUSTER_NAME_GRAMMAR}")]
    TooLong {
        /// Characters in the name.
        length: usize,
    },
    /// A character outside `a-z`, `0-9` and `-`.
    #[error("has {} at character {position}{}; a cluster name is {CLUSTER_NAME_GRAMMAR}", Shown(*.character), hint(*.character))]
    BadCharacter {
        /// 1-based position of the character.
        position: usize,
        /// The character.
        character: char,
    },
    /// The first character is a digit or `-`.
    #[error("starts with {}; a cluster name is {CLUSTER_NAME_GRAMMAR}", Shown(*.0))]
    BadStart(char),
    /// The last character is `-`.
    #[error("ends with `-`; a cluster name is {CLUSTER_NAME_GRAMMAR}")]
    EndsWithHyphen,
}

/// Checks `name` against the cluster-name grammar ([`CLUSTER_NAME_GRAMMAR`]). The first problem
/// found is reported: length, then each character in order, then the last character.
pub fn check_cluster_name(name: &str) -> Result<(), ClusterNameError> {
    if name.is_empty() {
        return Err(ClusterNameError::Empty);
    }
    let length = name.chars().count();
    if length > MAX_CLUSTER_NAME_LEN {
        return Err(ClusterNameError::TooLong { length });
    }
    for (index, character) in name.chars().enumerate() {
        let allowed = character.is_ascii_lowercase() || character.is_ascii_digit() || character == '-';
        if !allowed {
            return Err(ClusterNameError::BadCharacter { position: index + 1, character });
        }
        if index == 0 && !character.is_ascii_lowercase() {
            return Err(ClusterNameError::BadStart(character));
        }
    }
    if name.ends_with('-') {
        return Err(ClusterNameError::EndsWithHyphen);
    }
    Ok(())
}

/// Whether `name` follows the cluster-name grammar.
pub fn is_cluster_name(name: &str) -> bool {
    check_cluster_name(name).is_ok()
}

/// A character as a message shows it: printable ones in backticks, others (control characters,
/// spaces of every kind) as their code point, so the message stays on one line and unambiguous.
struct Shown(char);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        if c.is_control() || c.is_whitespace() || c == '`' {
            write!(f, "U+{:04X}", u32::from(c))
        } else {
            write!(f, "`{c}`")
        }
    }
}

fn hint(character: char) -> &'static str {
    if character.is_ascii_uppercase() { " (use lowercase)" } else { "" }
}

/// Whether `value` is a valid label value: up to 63 letters, digits, `-`, `_`, `.` (may be
/// empty).
pub fn is_label_value(value: &str) -> bool {
    value.len() <= MAX_NAME_LEN && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Whether `key` is a valid label key (job and cluster labels, and label selectors).
pub fn is_label_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_NAME_LEN
        && key.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_label_like_names_are_accepted() {
        for name in ["east", "west", "onprem-east", "cloud-burst", "k8s-west", "a", "a1", "gpu-host-07"] {
            assert_eq!(check_cluster_name(name), Ok(()), "{name}");
        }
        assert_eq!(check_cluster_name(&"a".repeat(63)), Ok(()));
    }

    #[test]
    fn each_refusal_says_where_the_name_goes_wrong() {
        let cases = [
            ("", ClusterNameError::Empty),
            ("a b", ClusterNameError::BadCharacter { position: 2, character: ' ' }),
            ("west/../east", ClusterNameError::BadCharacter { position: 5, character: '/' }),
            ("../../etc", ClusterNameError::BadCharacter { position: 1, character: '.' }),
            ("<script>", ClusterNameError::BadCharacter { position: 1, character: '<' }),
            ("east\nFAKE", ClusterNameError::BadCharacter { position: 5, character: '\n' }),
            ("East", ClusterNameError::BadCharacter { position: 1, character: 'E' }),
            ("on_prem", ClusterNameError::BadCharacter { position: 3, character: '_' }),
            ("ëast", ClusterNameError::BadCharacter { position: 1, character: 'ë' }),
            ("1east", ClusterNameError::BadStart('1')),
            ("-east", ClusterNameError::BadStart('-')),
            ("east-", ClusterNameError::EndsWithHyphen),
        ];
        for (name, expected) in cases {
            assert_eq!(check_cluster_name(name), Err(expected), "{name:?}");
        }
        assert_eq!(check_cluster_name(&"a".repeat(300)), Err(ClusterNameError::TooLong { length: 300 }));
        assert_eq!(check_cluster_name(&"a".repeat(64)), Err(ClusterNameError::TooLong { length: 64 }));
    }

    #[test]
    fn messages_show_the_offending_character_on_one_line_and_state_the_grammar() {
        let newline = check_cluster_name("east\nFAKE line").unwrap_err().to_string();
        assert_eq!(newline, format!("has U+000A at character 5; a cluster name is {CLUSTER_NAME_GRAMMAR}"));
        let slash = check_cluster_name("west/../east").unwrap_err().to_string();
        assert!(slash.starts_with("has `/` at character 5;"), "{slash}");
        let upper = check_cluster_name("East").unwrap_err().to_string();
        assert!(upper.starts_with("has `E` at character 1 (use lowercase);"), "{upper}");
        let long = check_cluster_name(&"a".repeat(300)).unwrap_err().to_string();
        assert!(long.starts_with("is 300 characters long;") && !long.contains("aaaa"), "{long}");
    }
}
