//! Snapshots of the parsed tiny models: the report and the full `Debug` description.

use crate::common;

fn snap(name: &str, text: String) {
    insta::with_settings!({ snapshot_path => "../../snapshots/model", prepend_module_to_snapshot => false, omit_expression => true }, {
        insta::assert_snapshot!(name, text);
    });
}

#[test]
fn tiny_qwen3_moe_report() {
    snap("tiny_qwen3_moe_report", common::spec("tiny-qwen3-moe.json").report());
}

#[test]
fn tiny_qwen3_moe_debug() {
    snap("tiny_qwen3_moe_debug", format!("{:#?}", common::spec("tiny-qwen3-moe.json")));
}

#[test]
fn tiny_mixtral_report() {
    snap("tiny_mixtral_report", common::spec("tiny-mixtral.json").report());
}

#[test]
fn qwen3_30b_a3b_report() {
    snap("qwen3_30b_a3b_report", common::spec("qwen3-30b-a3b.json").report());
}
