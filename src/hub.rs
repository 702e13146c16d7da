//! Weights from the Hugging Face hub.

/// Published MoGe-2 models: short name → Hugging Face repo.
pub const MODELS: &[(&str, &str)] = &[
    ("vits-normal", "Ruicheng/moge-2-vits-normal"),
    ("vitb-normal", "Ruicheng/moge-2-vitb-normal"),
    ("vitl-normal", "Ruicheng/moge-2-vitl-normal"),
    ("vitl", "Ruicheng/moge-2-vitl"),
];

/// The local path of a published model's `model.pt`, downloading it on first use.
pub fn resolve(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let repo = MODELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, r)| *r)
        .ok_or_else(|| anyhow::anyhow!("unknown model '{name}'"))?;
    anyhow::bail!("model {repo} is not available: hub download is not wired up yet; pass --weights PATH")
}
