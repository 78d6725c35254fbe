//! Helpers shared by the dsl's integration tests.

/// The 1-based line of the attribute (a line starting `#[`) of `source` (a test file's own
/// text, `include_str!`) that contains `needle`, which must be exactly one: error locations
/// are checked against the declaration they must point at, not against a line number that
/// formatting moves. Only attribute lines count, so the needle quoted in a test is not a hit.
pub fn line_of(source: &str, needle: &str) -> u32 {
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with("#[") && l.contains(needle))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(lines.len(), 1, "{needle:?} must be in exactly one attribute of the test file");
    lines[0] as u32 + 1
}
