//! Column-aligned plain-text tables and key/value blocks for terminal output.
//!
//! Tables are laid out by `comfy-table` without borders, colors or wrapping, the way `kubectl
//! get` prints: the same plain text on a terminal and in a pipe, so `grep` and `awk` read it and
//! scripts see what people see. Widths are measured in terminal columns (East Asian wide
//! characters count two), so names in any script stay aligned.

use comfy_table::{CellAlignment, ContentArrangement, presets};

/// Spaces between two columns.
const GAP: u16 = 3;

/// A table with a header row; columns are as wide as their widest cell.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Indexes of the columns whose cells (and header) are aligned to the right.
    right_aligned: Vec<usize>,
}

impl Table {
    /// An empty table with these column headers.
    pub fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table { headers: headers.into_iter().map(|header| clean(&header.into())).collect(), ..Table::default() }
    }

    /// Aligns column `index` (from 0) to the right, header included: for numbers.
    pub fn align_right(&mut self, index: usize) {
        self.right_aligned.push(index);
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
        let mut table = comfy_table::Table::new();
        table.load_style(presets::NOTHING).set_content_arrangement(ContentArrangement::Disabled);
        table.set_header(self.headers.clone());
        for row in &self.rows {
            table.add_row(row.clone());
        }
        let columns = table.column_count();
        for (index, column) in table.column_iter_mut().enumerate() {
            // The gap goes after every column but the last, so lines start at the margin.
            column.set_padding((0, if index + 1 < columns { GAP } else { 0 }));
            if self.right_aligned.contains(&index) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        let mut out = String::new();
        for line in table.lines() {
            out.push_str(line.trim_end());
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
    fn wide_characters_count_as_two_columns() {
        let mut table = Table::new(["NAME", "STATE"]);
        table.row(["東京-gpu", "Running"]);
        table.row(["paris", "Queued"]);
        table.row(["zürich", "Queued"]);
        // `東京-gpu` is 6 characters but 8 terminal columns wide.
        assert_eq!(
            table.render(),
            "NAME       STATE\n\
             東京-gpu   Running\n\
             paris      Queued\n\
             zürich     Queued\n"
        );
    }

    #[test]
    fn right_aligned_columns_line_up_their_last_digits() {
        let mut table = Table::new(["POLICY", "JOBS", "NOTE"]);
        table.align_right(1);
        table.row(["meridian", "1200", "ok"]);
        table.row(["random", "85", ""]);
        assert_eq!(table.render(), "POLICY     JOBS   NOTE\nmeridian   1200   ok\nrandom       85\n");
    }

    #[test]
    fn empty_table_prints_its_header() {
        assert_eq!(Table::new(["ID", "NAME"]).render(), "ID   NAME\n");
    }

    #[test]
    fn key_values_align_values() {
        let text = key_values(&[("ID", "j-1".into()), ("State", "Running".into()), ("Nodes", "a\nb".into())]);
        assert_eq!(text, "ID:     j-1\nState:  Running\nNodes:  a\n        b\n");
    }
}
