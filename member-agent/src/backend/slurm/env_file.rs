//! The description of a running test Slurm that `scripts/slurm/up.sh DIR` writes to `DIR/env`
//! (`export KEY=VALUE` lines: `SLURM_CONF`, `MERIDIAN_SLURM_DIR`, `MERIDIAN_SLURM_BIN_DIR`,
//! `MERIDIAN_SLURM_PARTITION`, …). The Slurm tests, the end-to-end tests and the `slurm_sync`
//! bench all find their cluster through `MERIDIAN_SLURM_ENV` naming such a file.

use std::collections::BTreeMap;
use std::path::Path;

/// Reads an env file of `export KEY=VALUE` lines into its keys and values; other lines are
/// ignored.
pub fn read_env_file(path: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("export ")?.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_lines_are_read_and_others_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env");
        std::fs::write(&path, "# made by up.sh\nexport SLURM_CONF=/tmp/s/slurm.conf\nexport A=b=c\nB=not-exported\n")
            .unwrap();
        let env = read_env_file(&path).unwrap();
        assert_eq!(env.len(), 2);
        assert_eq!(env["SLURM_CONF"], "/tmp/s/slurm.conf");
        assert_eq!(env["A"], "b=c");
    }
}
