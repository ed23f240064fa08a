//! A training forward cut into one piece per layer, so that its backward frees each layer's
//! activations as soon as that layer's gradients exist.
//!
//! candle's `backward` walks one graph, owned by the loss, and nothing in that graph is freed before
//! the whole backward returns: at the end it holds every layer's activations *and* every parameter's
//! gradient. At the Qwen2.5-0.5B shape (16 x 64 tokens) that is ~2.4 GB of activations on top of
//! 2 GB of gradients, where PyTorch frees each node's saved tensors as its backward runs.
//!
//! With a [`Tape`], the forward continues after each layer from a leaf copy of its output (a
//! [`Var`]), so each layer's graph is its own. [`Tape::backward`] runs candle's backward of the loss
//! (which stops at the last leaf), then walks the pieces top-down: the gradient that reached a leaf
//! is pushed into the piece below through the surrogate `sum(below * g)` (whose gradient with
//! respect to `below` is exactly `g`), and that piece is dropped once its gradients are taken.
//!
//! On the CPU in f32 a layer of the fused kernels is a piece of its own kind: the forward keeps its
//! activations in a record (`model::layer_grad`) and the backward differentiates it by hand,
//! with no graph of candle's; its output is a leaf like a cut's.
//!
//! The embedding lookup at the bottom is a piece of the tape's own ([`Tape::lookup`]): its rows'
//! gradients are added into the table's gradient in place.
//!
//! Across cuts the gradients are the ones of the uncut graph, bit for bit (tested in
//! tests/model_numerics.rs; the hand-differentiated layers match candle's backward to the last bits):
//! within a piece candle adds the same contributions in the same order; a layer's output has two
//! users (the next norm and the residual), whose sum does not depend on their order; and a tied
//! embedding gets its head's gradient first and then the lookup's rows one by one, as candle adds
//! them. A variable used on both sides of any other cut would have its parts summed in another
//! order, a rounding apart.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use roll_cpu_kernels::accumulate;
use roll_cpu_kernels::head::WeightGradSink;

use super::layer_grad::LayerRecord;

/// The pieces of a training forward (or of several whose outputs one loss combines), top-most last. Built by
/// [`super::Transformer::forward_hidden_taped`]; spent by [`Tape::backward`].
#[derive(Default)]
pub struct Tape {
    cuts: Vec<Piece>,
    /// One per taped forward (a loss may span several, e.g. a preference pair's two).
    lookups: Vec<Lookup>,
    /// Where the fused output head leaves its weight's gradient (see [`Tape::head_sink`]).
    head_grads: WeightGradSink,
    /// Seeds the random masks of the forwards' LoRA dropout (`model.lora.dropout`), with the
    /// count of forwards taped so far: each forward draws its own, and the same seed the same.
    seed: u64,
    forwards: u64,
}

/// The embedding lookup at the bottom, differentiated by the tape itself: its gradient is added
/// row by row into the table's gradient where that already is (a tied head's), in place, instead
/// of candle's zero-filled table plus `index_add` plus a sum (three tables' worth of memory at
/// the end of the backward, when every other gradient is held too).
struct Lookup {
    table: Tensor,
    ids: Tensor,
    above: Var,
}

/// A piece of the forward: a graph of candle's, or a layer differentiated by hand.
enum Piece {
    Graph(Cut),
    // Boxed: a record holds a layer's worth of tensor handles, a cut two.
    Layer(Box<Layer>),
}

/// A layer of the fused CPU kernels, recorded by `layer_grad::forward`: its backward needs no
/// graph of candle's.
struct Layer {
    /// The layer's input, where its gradient goes: the leaf of the piece below (or the lookup's).
    input: Tensor,
    record: LayerRecord,
    /// A leaf holding the layer's output: the input of the piece above.
    above: Var,
}

/// Where one piece ends and the next begins.
struct Cut {
    /// The output of the piece below, which owns that piece's graph.
    below: Tensor,
    /// A leaf copy of `below`: the input of the piece above, where its gradient arrives.
    above: Var,
}

impl Tape {
    /// A tape whose forwards draw their LoRA dropout masks from `seed` (a micro-batch's: see
    /// `role::epochs`).
    pub fn seeded(seed: u64) -> Tape {
        Tape {
            seed,
            ..Tape::default()
        }
    }

    /// The seed of the next taped forward's dropout masks.
    pub(super) fn next_dropout_seed(&mut self) -> u64 {
        self.forwards += 1;
        crate::seed::mix_seed(&[self.seed, self.forwards])
    }

    /// `x` continued as the input of a new piece: a leaf holding a copy of its values (a few MB per
    /// layer: one hidden state per token).
    pub fn cut(&mut self, x: Tensor) -> Result<Tensor> {
        let above = Var::from_tensor(&x.detach())?;
        let next = above.as_tensor().clone();
        self.cuts.push(Piece::Graph(Cut { below: x, above }));
        Ok(next)
    }

    /// A layer differentiated by hand, from `input` to `output` (detached): a leaf holding the
    /// output, as the input of the piece above.
    pub(super) fn layer(
        &mut self,
        input: Tensor,
        output: Tensor,
        record: LayerRecord,
    ) -> Result<Tensor> {
        let above = Var::from_tensor(&output)?;
        let next = above.as_tensor().clone();
        self.cuts.push(Piece::Layer(Box::new(Layer {
            input,
            record,
            above,
        })));
        Ok(next)
    }

    /// The rows `ids` (u32, any shape) of `table` (n, width) as a leaf of the first piece: ids'
    /// shape and then width, the leaf itself. The first layer reads it as its input, which is
    /// then a variable: its gradient comes straight here, where the rows reshaped by the caller
    /// were a graph of candle's below that layer, differentiated through the surrogate of
    /// `push_below` (0.5% of a tiny forward+backward). A table that is not trained is looked up
    /// as usual.
    pub fn lookup(&mut self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        let mut shape = ids.dims().to_vec();
        shape.push(table.dim(1)?);
        let ids = ids.flatten_all()?;
        if !table.track_op() {
            return table.index_select(&ids, 0)?.reshape(shape);
        }
        let above = Var::from_tensor(&table.detach().index_select(&ids, 0)?.reshape(shape)?)?;
        let rows = above.as_tensor().clone();
        self.lookups.push(Lookup {
            table: table.clone(),
            ids,
            above,
        });
        Ok(rows)
    }

    /// For the fused output head of this forward (`roll_cpu_kernels::head`): it leaves its weight's
    /// gradient here, and [`Tape::backward`] puts it into the store, instead of candle adding it
    /// into a zero-filled tensor of the weight's size while the step's memory peaks.
    pub fn head_sink(&self) -> WeightGradSink {
        self.head_grads.clone()
    }

    /// How many cuts the forward made (one per layer).
    pub fn len(&self) -> usize {
        self.cuts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cuts.is_empty()
    }

    /// The gradients of `loss` with respect to every variable it depends on, through all pieces, as
    /// `loss.backward()` of the uncut graph would give them; no leaf of the tape is in the result.
    ///
    /// The loss is taken, and dropped once its own piece is differentiated: if the caller holds
    /// nothing else of that piece (log-probs, entropies), its tensors (the head's logits: 622 MB
    /// at 1024 tokens of a 151,936-token vocabulary) are freed before the layers' backward.
    pub fn backward(mut self, loss: Tensor) -> Result<GradStore> {
        let mut grads = detached(loss.backward()?);
        drop(loss);
        for (weight, g) in self.head_grads.close() {
            // Before any piece below adds to it, as candle's order would have it (the head's part
            // of a tied embedding first); in the weight's dtype (a bf16 head's is made in f32).
            add_into(&mut grads, &weight, g.to_dtype(weight.dtype())?)?;
        }
        while let Some(piece) = self.cuts.pop() {
            let (below, above) = match piece {
                Piece::Graph(Cut { below, above }) => (below, above),
                Piece::Layer(layer) => {
                    layer.backward(&mut grads)?;
                    continue;
                }
            };
            // A piece whose output the loss does not reach adds nothing (pieces only reach down,
            // so every leaf's gradient is complete when its cut comes off the stack).
            let Some(g) = grads.remove(above.as_tensor()) else {
                continue;
            };
            // Only a variable used on both sides of a cut (tied embeddings: the input lookup and
            // the output head) is in both stores; `extend` adds those.
            grads.extend(push_below(&below, &g)?)?;
        }
        while let Some(Lookup { table, ids, above }) = self.lookups.pop() {
            let Some(g) = grads.remove(above.as_tensor()) else {
                continue;
            };
            // One row per id, as the table's rows are added.
            let g = g.reshape((ids.elem_count(), ()))?;
            // The store's gradient is ours alone: candle made it fresh and `detached` dropped the
            // only other handle on it.
            let sum = match grads.remove(&table) {
                Some(sum) => sum,
                None => table.zeros_like()?,
            };
            let sum = if accumulate::rows_apply(&sum, &ids, &g) {
                accumulate::add_rows_in_place(&sum, &ids, &g)?;
                sum
            } else {
                sum.index_add(&ids, &g, 0)?
            };
            grads.insert(&table, sum);
        }
        Ok(grads)
    }
}

/// `g` added into the gradient `grads` holds for `t` (in place where it can), or stored as it.
fn add_into(grads: &mut GradStore, t: &Tensor, g: Tensor) -> Result<()> {
    let sum = accumulate::summed(grads.remove(t), g)?;
    grads.insert(t, sum);
    Ok(())
}

/// The gradients of the graph that computed `below`, given `g`, the gradient that reached it:
/// candle's backward of the surrogate `sum(below * g)`, whose gradient with respect to `below` is
/// exactly `g`.
fn push_below(below: &Tensor, g: &Tensor) -> Result<GradStore> {
    // candle's gradients may carry graphs of their own (a product's gradient is built from the
    // other factor, a variable): the surrogate must see `g` as a constant.
    let g = g.detach();
    let mut piece = detached((below * &g)?.sum_all()?.backward()?);
    // candle also differentiates the surrogate with respect to `g`: a hidden state's worth per
    // layer that nobody reads.
    piece.remove(&g);
    Ok(piece)
}

impl Layer {
    /// Takes the gradient that reached the layer's output from `grads` and adds the layer's
    /// input's and weights' gradients into it (nothing when the loss does not reach the layer).
    fn backward(self, grads: &mut GradStore) -> Result<()> {
        let Some(g) = grads.remove(self.above.as_tensor()) else {
            return Ok(());
        };
        let (dx, weights) = self.record.backward(&g.detach())?;
        for (weight, g) in weights {
            add_into(grads, &weight, g)?;
        }
        if self.input.is_variable() {
            add_into(grads, &self.input, dx)?;
        } else if self.input.track_op() {
            // The input was computed from a leaf below (the first layer's is the lookup's rows
            // reshaped): candle carries dx down that graph.
            grads.extend(push_below(&self.input, &dx)?)?;
        }
        Ok(())
    }
}

/// `grads` with every gradient cut from its graph. candle builds a variable's gradient from the
/// forward's tensors (a weight's is `input.t() @ grad`, with `input` an activation), and a tensor
/// keeps the graph it was made from alive: undetached, the gradients of a piece would hold that
/// piece's activations until the optimizer step. The values are shared, not copied.
pub fn detached(mut grads: GradStore) -> GradStore {
    let ids: Vec<_> = grads.get_ids().copied().collect();
    for id in ids {
        if let Some(g) = grads.get_id(id).map(Tensor::detach) {
            grads.insert_id(id, g);
        }
    }
    grads
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// y = w2 * tanh(w1 * x) cut between the two factors: the cut gradients equal the uncut ones
    /// and the closed forms dy/dw2 = tanh(w1 x), dy/dw1 = w2 x (1 - tanh²(w1 x)).
    #[test]
    fn gradients_cross_the_cut_unchanged() {
        let d = Device::Cpu;
        let x = Tensor::new(&[0.5f32, -1.5, 2.0], &d).unwrap();
        let w1 = Var::new(&[0.3f32, 0.7, -0.2], &d).unwrap();
        let w2 = Var::new(&[1.1f32, -0.4, 0.9], &d).unwrap();
        let lower = |x: &Tensor| (x * w1.as_tensor()).unwrap().tanh().unwrap();
        let upper = |h: &Tensor| (h * w2.as_tensor()).unwrap().sum_all().unwrap();

        let whole = upper(&lower(&x)).backward().unwrap();
        let mut tape = Tape::default();
        let h = tape.cut(lower(&x)).unwrap();
        assert_eq!(tape.len(), 1);
        let cut = tape.backward(upper(&h)).unwrap();

        let get = |g: &GradStore, v: &Var| g.get(v.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(get(&whole, &w1), get(&cut, &w1));
        assert_eq!(get(&whole, &w2), get(&cut, &w2));
        assert!(cut.get(&h).is_none(), "the leaf's gradient is not returned");
        let (xs, a, b) = (
            [0.5f32, -1.5, 2.0],
            [0.3f32, 0.7, -0.2],
            [1.1f32, -0.4, 0.9],
        );
        for i in 0..3 {
            let t = (a[i] * xs[i]).tanh();
            assert!((get(&cut, &w2)[i] - t).abs() < 1e-6);
            assert!((get(&cut, &w1)[i] - b[i] * xs[i] * (1.0 - t * t)).abs() < 1e-6);
        }
    }

    /// The returned gradients hold no graph: they keep no activation of the forward alive.
    #[test]
    fn the_gradients_hold_no_graph() {
        let d = Device::Cpu;
        let w = Var::new(&[[1.0f32, 2.0], [3.0, 4.0]], &d).unwrap();
        let x = Tensor::new(&[[0.5f32, -1.0]], &d).unwrap();
        let mut tape = Tape::default();
        let h = tape.cut(x.matmul(w.as_tensor()).unwrap()).unwrap();
        let loss = h.matmul(w.as_tensor()).unwrap().sum_all().unwrap();
        let grads = tape.backward(loss).unwrap();
        let g = grads.get(w.as_tensor()).unwrap();
        assert!(!g.track_op(), "the gradient still holds a graph");
        // And the uncut backward's would have: candle builds `x.t() @ grad` from the activation.
        let whole = x
            .matmul(w.as_tensor())
            .unwrap()
            .matmul(w.as_tensor())
            .unwrap();
        let g = whole.sum_all().unwrap().backward().unwrap();
        assert!(g.get(w.as_tensor()).unwrap().track_op());
    }

    /// A looked-up table also used as the output head (tied embeddings): the tape adds the lookup's
    /// rows into the head's gradient in place, in candle's order, so the result is the uncut
    /// backward's bit for bit; an untied table gets the lookup's rows alone.
    #[test]
    fn a_tied_lookup_equals_the_uncut_backward_bit_for_bit() {
        let d = Device::Cpu;
        let table = Var::randn(0f32, 1.0, (7, 4), &d).unwrap();
        let mix = Var::randn(0f32, 1.0, (4, 4), &d).unwrap();
        let ids = Tensor::new(&[[2u32, 5, 2], [0, 2, 6]], &d).unwrap();
        // rows -> one "layer" -> logits against the table itself.
        let loss_from = |rows: &Tensor| {
            let h = rows.matmul(mix.as_tensor()).unwrap().tanh().unwrap();
            h.matmul(&table.as_tensor().t().unwrap())
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
        };
        let whole = loss_from(
            &table
                .as_tensor()
                .index_select(&ids.flatten_all().unwrap(), 0)
                .unwrap(),
        )
        .backward()
        .unwrap();
        let mut tape = Tape::default();
        // In ids' shape, then the table's width; flattened here, by a graph the cut's backward
        // differentiates.
        let rows = tape.lookup(table.as_tensor(), &ids).unwrap();
        assert_eq!(rows.dims(), [2, 3, 4]);
        let rows = rows.reshape((6, 4)).unwrap();
        let h = tape
            .cut(rows.matmul(mix.as_tensor()).unwrap().tanh().unwrap())
            .unwrap();
        let loss = h
            .matmul(&table.as_tensor().t().unwrap())
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let cut = tape.backward(loss).unwrap();
        let get = |g: &GradStore, v: &Var| g.get(v.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(get(&whole, &table), get(&cut, &table));
        assert_eq!(get(&whole, &mix), get(&cut, &mix));

        // Untied: the lookup's gradient alone, its rows summed per id (row 2 three times).
        let mut tape = Tape::default();
        let rows = tape.lookup(table.as_tensor(), &ids).unwrap();
        let loss = rows.sum_all().unwrap();
        let g = get(&tape.backward(loss).unwrap(), &table);
        let seen = [1.0f32, 0.0, 3.0, 0.0, 0.0, 1.0, 1.0];
        for (row, n) in g.iter().zip(seen) {
            assert!(row.iter().all(|&v| v == n), "{g:?}");
        }
    }

    /// Two lookups into one tape (a loss over two forwards) both reach the table.
    #[test]
    fn every_lookup_of_a_tape_counts() {
        let d = Device::Cpu;
        let table = Var::new(&[[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]], &d).unwrap();
        let mut tape = Tape::default();
        let a = tape
            .lookup(table.as_tensor(), &Tensor::new(&[0u32, 2], &d).unwrap())
            .unwrap();
        let b = tape
            .lookup(table.as_tensor(), &Tensor::new(&[2u32], &d).unwrap())
            .unwrap();
        let loss = (a.sum_all().unwrap() + (b.sum_all().unwrap() * 3.0).unwrap()).unwrap();
        let g = tape.backward(loss).unwrap();
        let g = g.get(table.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(g, vec![vec![1.0, 1.0], vec![0.0, 0.0], vec![4.0, 4.0]]);
    }

    /// A variable used below and above the cut (a tied embedding) gets the sum of both sides.
    #[test]
    fn a_variable_on_both_sides_gets_both_contributions() {
        let d = Device::Cpu;
        let w = Var::new(&[2.0f32, -3.0], &d).unwrap();
        // y = sum(w * (w * x)) = sum(w² x): dy/dw = 2 w x.
        let x = Tensor::new(&[1.5f32, 0.25], &d).unwrap();
        let mut tape = Tape::default();
        let h = tape.cut((w.as_tensor() * &x).unwrap()).unwrap();
        let loss = (w.as_tensor() * h).unwrap().sum_all().unwrap();
        let g = tape.backward(loss).unwrap();
        let g = g.get(w.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(g, vec![2.0 * 2.0 * 1.5, 2.0 * -3.0 * 0.25]);
    }

    /// A loss that ignores the cut output gives no gradient below it and no stray leaf entries.
    #[test]
    fn a_loss_that_skips_the_cut_stops_there() {
        let d = Device::Cpu;
        let below_w = Var::new(&[1.0f32], &d).unwrap();
        let above_w = Var::new(&[4.0f32], &d).unwrap();
        let mut tape = Tape::default();
        let h = tape.cut((below_w.as_tensor() * 3.0).unwrap()).unwrap();
        let loss = (above_w.as_tensor() * 2.0).unwrap().sum_all().unwrap();
        let g = tape.backward(loss).unwrap();
        assert!(g.get(below_w.as_tensor()).is_none());
        assert!(g.get(&h).is_none());
        assert_eq!(
            g.get(above_w.as_tensor())
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![2.0]
        );
    }
}
