//! The model path for non-CPU devices (candle's generic ops, forced here on the CPU with
//! `MOGE_GENERIC_OPS=1`) against the same upstream fixtures as the CPU kernels.
mod support;

#[test]
fn generic_ops_match_upstream_stages() {
    // Set before the first model call of this test binary (the switch is read once).
    std::env::set_var("MOGE_GENERIC_OPS", "1");
    assert!(!moge::model::cpu::enabled());
    for ckpt in ["tiny_normal", "tiny_vitl", "random_normal"] {
        support::check_stages(ckpt);
    }
}
