//! Reading the YAML configuration files of the gateway and the agent: one error type and one
//! parser, so both report problems the same way (file, field path, reason; all at once).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not YAML, or unknown or mistyped fields.
    #[error("config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Field path and reason.
        message: String,
    },
    /// Fields have values out of range.
    #[error("config {path} is invalid:\n  {}", .problems.join("\n  "))]
    Invalid {
        /// The file (or `<defaults>`).
        path: PathBuf,
        /// One line per problem, each naming its field.
        problems: Vec<String>,
    },
}

/// Reads a config file's text.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })
}

/// Parses YAML text into `T`, naming the field path of the first unknown or mistyped field.
pub fn parse_yaml<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, ConfigError> {
    let parse_error = |message: String| ConfigError::Parse { path: path.to_path_buf(), message };
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| parse_error(e.to_string()))?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        parse_error(format!("{field}: {}", e.into_inner()))
    })
}

/// `Ok` when `problems` is empty, else every problem at once.
pub fn check(path: &Path, problems: Vec<String>) -> Result<(), ConfigError> {
    if problems.is_empty() { Ok(()) } else { Err(ConfigError::Invalid { path: path.to_path_buf(), problems }) }
}
