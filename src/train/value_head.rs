//! The critic's value head: a linear map from the final hidden state to one scalar per position.
//! Saved beside the critic's HF directory as `value_head.safetensors`.

use std::path::Path;

use candle_core::{DType, Device, Result, Tensor, Var};

pub struct ValueHead {
    /// (1, hidden)
    pub weight: Var,
    /// (1,)
    pub bias: Var,
}

impl ValueHead {
    /// Zero-initialised, so the critic starts by predicting 0 everywhere (no spurious advantages).
    pub fn new(hidden: usize, device: &Device) -> Result<Self> {
        Ok(ValueHead {
            weight: Var::zeros((1, hidden), DType::F32, device)?,
            bias: Var::zeros(1, DType::F32, device)?,
        })
    }

    /// hidden: (b, t, h) -> values (b, t)
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let (b, t, h) = hidden.dims3()?;
        let x = hidden.to_dtype(DType::F32)?.reshape((b * t, h))?;
        x.matmul(&self.weight.as_tensor().t()?)?
            .broadcast_add(self.bias.as_tensor())?
            .reshape((b, t))
    }

    pub fn vars(&self) -> Vec<(String, Var)> {
        vec![
            ("value_head.weight".into(), self.weight.clone()),
            ("value_head.bias".into(), self.bias.clone()),
        ]
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let map: std::collections::HashMap<String, Tensor> = self
            .vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&map, path)
    }

    pub fn load(path: &Path, hidden: usize, device: &Device) -> Result<Self> {
        let tensors = candle_core::safetensors::load(path, device)?;
        let get = |name: &str| match tensors.get(name) {
            Some(t) => Ok(t.to_dtype(DType::F32)?),
            None => candle_core::bail!("'{}' has no tensor '{name}'", path.display()),
        };
        let (w, b) = (get("value_head.weight")?, get("value_head.bias")?);
        if w.dims() != [1, hidden] {
            candle_core::bail!(
                "'{}': value_head.weight has shape {:?}, expected [1, {hidden}]",
                path.display(),
                w.dims()
            );
        }
        Ok(ValueHead {
            weight: Var::from_tensor(&w)?,
            bias: Var::from_tensor(&b)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_a_linear_map_of_hidden_states() {
        let head = ValueHead::new(2, &Device::Cpu).unwrap();
        head.weight
            .set(&Tensor::new(&[[1.0f32, -2.0]], &Device::Cpu).unwrap())
            .unwrap();
        head.bias
            .set(&Tensor::new(&[0.5f32], &Device::Cpu).unwrap())
            .unwrap();
        let hidden = Tensor::new(&[[[1.0f32, 1.0], [2.0, 0.0]]], &Device::Cpu).unwrap();
        // 1 - 2 + .5 = -0.5; 2 - 0 + .5 = 2.5
        assert_eq!(
            head.forward(&hidden).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![-0.5, 2.5]]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("value_head.safetensors");
        head.save(&path).unwrap();
        let back = ValueHead::load(&path, 2, &Device::Cpu).unwrap();
        assert_eq!(
            back.forward(&hidden).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![-0.5, 2.5]]
        );
    }
}
