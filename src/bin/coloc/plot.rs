//! What the pictures share (the model report's, `coloc eval kace --plot`'s and the
//! simulation's): one palette and the embedded font.

use anyhow::anyhow;
use plotters::{
    prelude::RGBColor,
    style::{register_font, FontStyle},
};

/// The series colours (matplotlib's first eight).
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The colour of the `i`-th series of the model report and the evaluation plot: they cycle
/// through the first six colours of `PALETTE` (the simulation uses all eight, one per
/// policy).
pub fn cycled(i: usize) -> RGBColor {
    PALETTE[i % 6]
}

/// Registers the embedded font as "sans-serif": the pictures are independent of system
/// font libraries.
pub fn register_embedded_font() -> anyhow::Result<()> {
    register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("the embedded font cannot be loaded"))
}
