//! Names shared between a snapshot and the decisions made from it.
//!
//! Every decision names all ~100 clusters of the federation (cluster, region, GPU type). Copying
//! each as a `String` was a third of placement's time; a [`Name`] is one reference-counted copy of
//! the text, made when the snapshot is built, that decisions share.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A cluster, region or GPU type name. Reads like a `&str` (it derefs to one and compares equal
/// to strings) and serializes as a plain JSON string; cloning it does not copy the text.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Name(Arc<str>);

impl Name {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Self {
        Self(Arc::from(name))
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Self(Arc::from(name))
    }
}

impl From<&String> for Name {
    fn from(name: &String) -> Self {
        Self(Arc::from(name.as_str()))
    }
}

impl From<Name> for String {
    fn from(name: Name) -> Self {
        name.0.as_ref().to_owned()
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        *self == *other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        **self == *other.0
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        **self == *other.0
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

/// A shared list of names (the GPU types a cluster has, the regions a job allows), built once and
/// named by many rejections. Reads like a slice of [`Name`]s and serializes as a JSON array of
/// strings; cloning it does not copy the list.
#[derive(Clone, PartialEq, Eq)]
pub struct Names(Arc<[Name]>);

impl Deref for Names {
    type Target = [Name];

    fn deref(&self) -> &[Name] {
        &self.0
    }
}

impl From<Vec<Name>> for Names {
    fn from(names: Vec<Name>) -> Self {
        Self(Arc::from(names))
    }
}

impl From<&[String]> for Names {
    fn from(names: &[String]) -> Self {
        names.iter().map(Name::from).collect()
    }
}

impl<const N: usize> From<[&str; N]> for Names {
    fn from(names: [&str; N]) -> Self {
        names.into_iter().map(Name::from).collect()
    }
}

impl FromIterator<Name> for Names {
    fn from_iter<I: IntoIterator<Item = Name>>(names: I) -> Self {
        Self(names.into_iter().collect())
    }
}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl Serialize for Names {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter())
    }
}

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Name>::deserialize(deserializer).map(Self::from)
    }
}
