//! `webshop`: WebShop-style shopping (Yao et al., 2022) over a local catalogue ([`catalogue`]).
//! An instruction drawn from the seed asks for a product type with attributes, option values and a
//! price limit. Pages and actions follow WebShop's text mode: on the search page `search[query]`;
//! on a results page `click[<product id>]`, `click[next >]`, `click[< prev]`,
//! `click[back to search]`; on a product page `click[<option value>]`, `click[< prev]`,
//! `click[back to search]` and `click[buy now]`, which ends the episode with the WebShop score
//! ([`score`]). Anything else is an invalid action and changes nothing.

pub mod catalogue;
mod score;

use std::collections::HashSet;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value};

use super::{Env, EnvFailure, Grid, Step, StepError, stable_hash};
use crate::seed::mix_seed;
use catalogue::Product;
pub use score::{Goal, score};

/// Results per page, as WebShop shows them.
const PER_PAGE: usize = 10;

#[derive(Debug, Clone, PartialEq)]
enum Page {
    Search,
    Results {
        query: String,
        page: usize,
    },
    Item {
        query: String,
        page: usize,
        product: usize,
    },
}

#[derive(Clone)]
pub struct WebShop {
    products: Arc<Vec<Product>>,
    /// Each product's searchable words: title, type, attributes and category, lowercase.
    index: Arc<Vec<HashSet<String>>>,
    max_steps: usize,
    goal: Goal,
    page: Page,
    /// Option group → the value clicked on the current product page.
    selected: std::collections::BTreeMap<String, String>,
    steps: usize,
    done: bool,
    reward: f64,
}

impl WebShop {
    /// `catalogue` (a JSON-lines file; default: the generated catalogue that
    /// `envs/webshop/catalogue.jsonl` holds), `products` (use only the catalogue's first N, as
    /// WebShop's `num_products` does: a smaller shop, shorter result lists; a file must hold N,
    /// the generated catalogue is drawn to N), `max_steps` (15).
    pub fn from_params(params: &[(String, String)]) -> Result<WebShop, String> {
        const KNOWN: [&str; 3] = ["catalogue", "products", "max_steps"];
        let mut products = None;
        let mut keep = None;
        let mut max_steps = 15;
        for (k, v) in params {
            match k.as_str() {
                "catalogue" => products = Some(catalogue::load(std::path::Path::new(v))?),
                "max_steps" => max_steps = whole_number(k, v)?,
                "products" => keep = Some(whole_number(k, v)?),
                other => {
                    return Err(format!(
                        "unknown parameter '{other}'{} (known: {})",
                        crate::text::suggestion_suffix(other, KNOWN),
                        KNOWN.join(", ")
                    ));
                }
            }
        }
        // The generated catalogue's first N products are `generate(0, N)`: its random stream
        // draws product after product, so a prefix needs no more than N of them.
        let mut products = products
            .unwrap_or_else(|| catalogue::generate(0, keep.unwrap_or(catalogue::DEFAULT_PRODUCTS)));
        if let Some(n) = keep {
            if n > products.len() {
                return Err(format!(
                    "products {n}: the catalogue has only {} products",
                    products.len()
                ));
            }
            products.truncate(n);
        }
        let goal = draw_goal(&products, 0);
        let index = products
            .iter()
            .map(|p| {
                [&p.title, &p.product_type]
                    .into_iter()
                    .chain(&p.attributes)
                    .chain(&p.category)
                    .flat_map(|t| t.split_whitespace())
                    .map(str::to_lowercase)
                    .collect()
            })
            .collect();
        Ok(WebShop {
            products: Arc::new(products),
            index: Arc::new(index),
            max_steps,
            goal,
            page: Page::Search,
            selected: Default::default(),
            steps: 0,
            done: false,
            reward: 0.0,
        })
    }

    /// Indices of the products matching `query`, best first: products scored by how many of the
    /// query's words their title, type, attributes and category hold (ties by catalogue order).
    fn search(&self, query: &str) -> Vec<usize> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let mut scored: Vec<(usize, usize)> = self
            .index
            .iter()
            .enumerate()
            .filter_map(|(i, have)| {
                let hits = words.iter().filter(|w| have.contains(w.as_str())).count();
                (hits > 0).then_some((hits, i))
            })
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().map(|(_, i)| i).collect()
    }

    /// What can be clicked on the current page (lowercase), besides `search[…]`.
    fn clickables(&self) -> Vec<String> {
        match &self.page {
            Page::Search => vec![],
            Page::Results { query, page } => {
                let hits = self.search(query);
                let mut c = vec!["back to search".to_string()];
                if *page > 1 {
                    c.push("< prev".into());
                }
                if hits.len() > page * PER_PAGE {
                    c.push("next >".into());
                }
                c.extend(
                    hits.iter()
                        .skip((page - 1) * PER_PAGE)
                        .take(PER_PAGE)
                        .map(|&i| self.products[i].id.to_lowercase()),
                );
                c
            }
            Page::Item { product, .. } => {
                let mut c = vec!["back to search".to_string(), "< prev".into()];
                for values in self.products[*product].options.values() {
                    c.extend(values.iter().cloned());
                }
                c.push("buy now".into());
                c
            }
        }
    }

    fn click(&mut self, target: &str) -> Result<f64, String> {
        let target = target.trim().to_lowercase();
        if !self.clickables().contains(&target) {
            return Err(format!("'{target}' cannot be clicked on this page"));
        }
        let page = std::mem::replace(&mut self.page, Page::Search);
        self.page = match (page, target.as_str()) {
            (_, "back to search") => Page::Search,
            (Page::Results { query, page }, "next >") => Page::Results {
                query,
                page: page + 1,
            },
            (Page::Results { query, page }, "< prev") => Page::Results {
                query,
                page: page - 1,
            },
            (Page::Item { query, page, .. }, "< prev") => Page::Results { query, page },
            (
                Page::Item {
                    query,
                    page,
                    product,
                },
                "buy now",
            ) => {
                self.done = true;
                self.reward = score(&self.goal, &self.products[product], &self.selected);
                Page::Item {
                    query,
                    page,
                    product,
                }
            }
            (
                Page::Item {
                    query,
                    page,
                    product,
                },
                value,
            ) => {
                // An option value: select it in its group.
                let group = self.products[product]
                    .options
                    .iter()
                    .find(|(_, vs)| vs.iter().any(|v| v == value))
                    .map(|(g, _)| g.clone());
                if let Some(group) = group {
                    self.selected.insert(group, value.to_string());
                }
                Page::Item {
                    query,
                    page,
                    product,
                }
            }
            (Page::Results { query, page }, id) => {
                let product = self
                    .products
                    .iter()
                    .position(|p| p.id.to_lowercase() == id)
                    .unwrap_or(0);
                self.selected.clear();
                Page::Item {
                    query,
                    page,
                    product,
                }
            }
            (Page::Search, _) => Page::Search,
        };
        Ok(if self.done { self.reward } else { 0.0 })
    }

    fn page_text(&self) -> String {
        let mut t = format!("Instruction: {}\n", self.goal.instruction);
        match &self.page {
            Page::Search => t.push_str("[Search]"),
            Page::Results { query, page } => {
                let hits = self.search(query);
                let pages = hits.len().div_ceil(PER_PAGE).max(1);
                t.push_str(&format!(
                    "Results for \"{query}\" (page {page} of {pages}, {} products)\n[Back to Search]",
                    hits.len()
                ));
                if *page > 1 {
                    t.push_str(" [< Prev]");
                }
                if hits.len() > page * PER_PAGE {
                    t.push_str(" [Next >]");
                }
                for &i in hits.iter().skip((page - 1) * PER_PAGE).take(PER_PAGE) {
                    let p = &self.products[i];
                    t.push_str(&format!("\n[{}] {} ${:.2}", p.id, p.title, p.price));
                }
            }
            Page::Item { product, .. } => {
                let p = &self.products[*product];
                t.push_str("[Back to Search] [< Prev]\n");
                t.push_str(&format!("{} ${:.2}\n", p.title, p.price));
                t.push_str(&format!("Features: {}\n", p.attributes.join(", ")));
                for (group, values) in &p.options {
                    let shown: Vec<String> = values
                        .iter()
                        .map(|v| match self.selected.get(group) == Some(v) {
                            true => format!("[{v}]*"),
                            false => format!("[{v}]"),
                        })
                        .collect();
                    t.push_str(&format!("{group}: {}\n", shown.join(" ")));
                }
                t.push_str("[Buy Now]");
            }
        }
        t
    }
}

impl Env for WebShop {
    fn name(&self) -> &'static str {
        "webshop"
    }

    fn clone_box(&self) -> Box<dyn Env> {
        Box::new(self.clone())
    }

    fn action_format(&self) -> String {
        "search[your query] on the search page, or click[a bracketed item on the page] (a product \
         id, an option, Next >, < Prev, Back to Search, Buy Now)"
            .into()
    }

    /// The page's clicks; on the search page, a search for the instruction's product type (a
    /// random policy gets somewhere).
    fn actions(&self) -> Vec<String> {
        match self.page {
            Page::Search => vec![format!("search[{}]", self.goal.product_type)],
            _ => self
                .clickables()
                .into_iter()
                .map(|c| format!("click[{c}]"))
                .collect(),
        }
    }

    fn reset(&mut self, seed: u64) -> Result<String, EnvFailure> {
        self.goal = draw_goal(&self.products, seed);
        (self.page, self.steps, self.done, self.reward) = (Page::Search, 0, false, 0.0);
        self.selected.clear();
        Ok(self.render_text())
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let action = action.trim();
        let (verb, arg) = match action.split_once('[') {
            Some((verb, rest)) if rest.ends_with(']') => {
                (verb.trim().to_lowercase(), &rest[..rest.len() - 1])
            }
            _ => {
                return Err(StepError::Invalid(format!(
                    "'{action}' is not search[…] or click[…]"
                )));
            }
        };
        if self.done {
            return Ok(Step::now(self, 0.0, true));
        }
        let reward = match (verb.as_str(), &self.page) {
            ("search", Page::Search) if !arg.trim().is_empty() => {
                self.page = Page::Results {
                    query: arg.trim().to_lowercase(),
                    page: 1,
                };
                0.0
            }
            ("search", _) => {
                return Err(StepError::Invalid(
                    "search[…] needs the search page and a query (click[back to search] first)"
                        .into(),
                ));
            }
            ("click", _) => self.click(arg).map_err(StepError::Invalid)?,
            _ => {
                return Err(StepError::Invalid(format!(
                    "'{verb}' is not an action (search or click)"
                )));
            }
        };
        self.steps += 1;
        if !self.done && self.steps >= self.max_steps {
            self.done = true;
        }
        Ok(Step::now(self, reward, self.done))
    }

    /// `success` (bought with score 1, as WebShop counts it), `score`, `steps`, `page`.
    fn info(&self) -> Map<String, Value> {
        let mut info = Map::new();
        info.insert(
            "success".into(),
            Value::Bool(self.done && self.reward >= 1.0),
        );
        info.insert("score".into(), Value::from(self.reward));
        info.insert("steps".into(), Value::from(self.steps));
        let page = match self.page {
            Page::Search => "search",
            Page::Results { .. } => "results",
            Page::Item { .. } => "item",
        };
        info.insert("page".into(), Value::from(page));
        info
    }

    fn render_text(&self) -> String {
        self.page_text()
    }

    fn render_grid(&self) -> Grid {
        Grid {
            rows: self
                .page_text()
                .lines()
                .map(|l| l.chars().collect())
                .collect(),
            agent: (0, 0),
        }
    }

    /// The page (with its query and product) and the options selected; not the step count.
    fn state_hash(&self) -> u64 {
        let key = format!(
            "{}|{:?}|{:?}|{}",
            self.goal.instruction, self.page, self.selected, self.done
        );
        stable_hash(key.as_bytes())
    }
}

/// `v` as a whole number >= 1, or an error naming parameter `k`.
fn whole_number(k: &str, v: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{k} '{v}' must be a whole number >= 1"))
}

/// A random product of `products` and a goal drawn from it, as WebShop's instructions are.
fn draw_goal(products: &[Product], seed: u64) -> Goal {
    let mut rng = StdRng::seed_from_u64(mix_seed(&[seed, 0x5b1]));
    let target = &products[rng.random_range(0..products.len())];
    let n = rng.random_range(1..=2.min(target.attributes.len().max(1)));
    let attributes: Vec<String> = target
        .attributes
        .choose_multiple(&mut rng, n)
        .cloned()
        .collect();
    let options: std::collections::BTreeMap<String, String> = target
        .options
        .iter()
        .filter_map(|(g, vs)| vs.choose(&mut rng).map(|v| (g.clone(), v.clone())))
        .collect();
    // A limit above the price, rounded up to ten dollars: the target always fits.
    let price_upper = ((target.price * rng.random_range(1.1..1.6)) / 10.0).ceil() * 10.0;
    Goal::new(target, attributes, options, price_upper)
}

#[cfg(test)]
mod tests;
