//! Column-aligned plain-text tables and key/value blocks for terminal output.

/// Spaces between two columns.
const GAP: usize = 3;

/// A table with a header row; columns are as wide as their widest cell.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column headers.
    pub fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table { headers: headers.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Appends a row. Missing cells print empty; line breaks and tabs in cells print as spaces
    /// so they cannot break the alignment.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(|cell| clean(&cell.into())).collect());
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text: header line, then one line per row, each ending in `\n`, with no
    /// trailing spaces.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).chain([self.headers.len()]).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            for (width, cell) in widths.iter_mut().zip(line) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = String::new();
            for (index, width) in widths.iter().enumerate() {
                let cell = line.get(index).map(String::as_str).unwrap_or("");
                text.push_str(cell);
                if index + 1 < columns {
                    let padding = width - cell.chars().count() + GAP;
                    text.extend(std::iter::repeat_n(' ', padding));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `Key:   value` lines with the values aligned; a multi-line value continues under its start.
pub fn key_values(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.chars().count() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let label = format!("{key}:");
        let mut lines = value.lines();
        let first = lines.next().unwrap_or("");
        out.push_str(format!("{label:<width$}  {first}").trim_end());
        out.push('\n');
        for line in lines {
            out.push_str(format!("{:width$}  {line}", "").trim_end());
            out.push('\n');
        }
    }
    out
}

fn clean(cell: &str) -> String {
    cell.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_to_the_widest_cell() {
        let mut table = Table::new(["NAME", "GPUS", "STATE"]);
        table.row(["onprem-east", "2×8", "Running"]);
        table.row(["gcp", "16", "Queued"]);
        assert_eq!(
            table.render(),
            "NAME          GPUS   STATE\n\
             onprem-east   2×8    Running\n\
             gcp           16     Queued\n"
        );
    }

    #[test]
    fn short_rows_pad_and_trailing_spaces_are_trimmed() {
        let mut table = Table::new(["A", "B"]);
        table.row(["x"]);
        table.row(["y", "z", "extra"]);
        assert_eq!(table.render(), "A   B\nx\ny   z   extra\n");
    }

    #[test]
    fn line_breaks_in_cells_do_not_break_rows() {
        let mut table = Table::new(["MESSAGE"]);
        table.row(["two\nlines"]);
        assert_eq!(table.render(), "MESSAGE\ntwo lines\n");
        assert!(!table.is_empty());
        assert!(Table::new(["X"]).is_empty());
    }

    #[test]
    fn key_values_align_values() {
        let text = key_values(&[("ID", "j-1".into()), ("State", "Running".into()), ("Nodes", "a\nb".into())]);
        assert_eq!(text, "ID:     j-1\nState:  Running\nNodes:  a\n        b\n");
    }
}
