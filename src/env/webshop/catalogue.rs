//! The shop's products: generated from a seed (never downloaded), or read from a JSON-lines file
//! of the same shape (`envs/webshop/catalogue.jsonl` is the default catalogue, written out).
//! Every product has a type (`t-shirt`), a category path, attributes (`machine wash`), option
//! groups (`color: black, navy`) and a price; instructions are drawn from them.

use std::collections::BTreeMap;
use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::seed::mix_seed;

/// Products in the default catalogue.
pub const DEFAULT_PRODUCTS: usize = 300;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Product {
    /// What `click[...]` names on a results page (`B0042`).
    pub id: String,
    pub title: String,
    /// The product's type, the noun a shopper asks for (`t-shirt`).
    pub product_type: String,
    /// Category path, most general first (`clothing › men › tops`).
    pub category: Vec<String>,
    pub attributes: Vec<String>,
    /// Option groups and their values (`color: [black, navy]`).
    pub options: BTreeMap<String, Vec<String>>,
    pub price: f64,
}

/// One department: its types (with a sub-category each), attributes, option groups, price range.
struct Department {
    name: &'static str,
    types: &'static [(&'static str, &'static str)],
    attributes: &'static [&'static str],
    options: &'static [(&'static str, &'static [&'static str])],
    price: (f64, f64),
}

const COLORS: &[&str] = &["black", "white", "navy", "red", "grey", "green"];
const PACKS: &[&str] = &["1 pack", "2 pack", "4 pack"];

const DEPARTMENTS: &[Department] = &[
    Department {
        name: "clothing",
        types: &[
            ("t-shirt", "tops"),
            ("hoodie", "tops"),
            ("jeans", "bottoms"),
            ("jacket", "outerwear"),
            ("sneakers", "shoes"),
            ("socks", "accessories"),
        ],
        attributes: &[
            "machine wash",
            "cotton",
            "slim fit",
            "long sleeve",
            "water resistant",
            "relaxed fit",
            "stretch",
        ],
        options: &[
            ("color", COLORS),
            ("size", &["small", "medium", "large", "x-large"]),
        ],
        price: (9.0, 80.0),
    },
    Department {
        name: "beauty",
        types: &[
            ("shampoo", "hair care"),
            ("lotion", "skin care"),
            ("lipstick", "makeup"),
            ("sunscreen", "skin care"),
            ("nail polish", "makeup"),
        ],
        attributes: &[
            "paraben free",
            "cruelty free",
            "long lasting",
            "natural ingredients",
            "sensitive skin",
            "travel size",
            "vegan",
        ],
        options: &[
            ("scent", &["lavender", "vanilla", "unscented", "citrus"]),
            ("size", &["2 oz", "8 oz", "16 oz"]),
        ],
        price: (4.0, 45.0),
    },
    Department {
        name: "home",
        types: &[
            ("pillow", "bedding"),
            ("blanket", "bedding"),
            ("lamp", "lighting"),
            ("curtain", "decor"),
            ("rug", "decor"),
            ("mug", "kitchen"),
        ],
        attributes: &[
            "easy clean",
            "machine washable",
            "energy saving",
            "non slip",
            "handmade",
            "eco friendly",
        ],
        options: &[("color", COLORS), ("pack", PACKS)],
        price: (8.0, 120.0),
    },
    Department {
        name: "electronics",
        types: &[
            ("headphones", "audio"),
            ("speaker", "audio"),
            ("phone case", "phone accessories"),
            ("charger", "phone accessories"),
            ("keyboard", "computer accessories"),
            ("mouse", "computer accessories"),
        ],
        attributes: &[
            "wireless",
            "bluetooth",
            "fast charging",
            "noise cancelling",
            "water resistant",
            "usb c",
            "long battery life",
        ],
        options: &[("color", COLORS), ("pack", PACKS)],
        price: (10.0, 150.0),
    },
    Department {
        name: "grocery",
        types: &[
            ("coffee", "beverages"),
            ("tea", "beverages"),
            ("granola", "breakfast"),
            ("snack bars", "snacks"),
            ("honey", "pantry"),
        ],
        attributes: &[
            "gluten free",
            "organic",
            "non gmo",
            "sugar free",
            "low calorie",
            "keto friendly",
        ],
        options: &[
            ("flavor", &["original", "vanilla", "chocolate", "mint"]),
            ("size", &["12 oz", "24 oz", "6 pack"]),
        ],
        price: (3.0, 40.0),
    },
];

const BRANDS: &[&str] = &[
    "northwind",
    "acme",
    "bluebird",
    "evergreen",
    "solstice",
    "harbor",
    "lumen",
    "meadow",
    "summit",
    "kestrel",
];

/// `count` products from `seed`: each a department's type, 2–4 of its attributes, its option
/// groups with 2–4 values each, and a price in its range (cents).
pub fn generate(seed: u64, count: usize) -> Vec<Product> {
    let mut rng = StdRng::seed_from_u64(mix_seed(&[seed, 0x5b0]));
    (0..count)
        .map(|i| {
            let dept = &DEPARTMENTS[rng.random_range(0..DEPARTMENTS.len())];
            let &(product_type, sub) = dept.types.choose(&mut rng).unwrap_or(&("item", "misc"));
            let n_attrs = rng.random_range(2..=4.min(dept.attributes.len()));
            let mut attributes: Vec<String> = dept
                .attributes
                .choose_multiple(&mut rng, n_attrs)
                .map(|a| a.to_string())
                .collect();
            attributes.sort();
            let options = dept
                .options
                .iter()
                .map(|(name, values)| {
                    let n = rng.random_range(2..=4.min(values.len()));
                    let mut chosen: Vec<String> = values
                        .choose_multiple(&mut rng, n)
                        .map(|v| v.to_string())
                        .collect();
                    chosen.shuffle(&mut rng);
                    (name.to_string(), chosen)
                })
                .collect();
            let brand = BRANDS.choose(&mut rng).unwrap_or(&"acme");
            let (lo, hi) = dept.price;
            let cents = rng.random_range((lo * 100.0) as u64..=(hi * 100.0) as u64);
            // A title shows the brand, one or two attributes and the type, as shop titles do.
            let shown = &attributes[..rng.random_range(1..=2)];
            Product {
                id: format!("B{:04}", i + 1),
                title: format!("{brand} {} {product_type}", shown.join(" ")),
                product_type: product_type.to_string(),
                category: vec![
                    dept.name.to_string(),
                    sub.to_string(),
                    product_type.to_string(),
                ],
                attributes,
                options,
                price: cents as f64 / 100.0,
            }
        })
        .collect()
}

/// A catalogue file: one product per line, as [`write`] writes it; errors name the line.
pub fn load(path: &Path) -> Result<Vec<Product>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("catalogue '{}': {e}", path.display()))?;
    let mut products = vec![];
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let p: Product = serde_json::from_str(line)
            .map_err(|e| format!("catalogue '{}' line {}: {e}", path.display(), i + 1))?;
        if p.options.values().any(Vec::is_empty) || !(p.price.is_finite() && p.price >= 0.0) {
            return Err(format!(
                "catalogue '{}' line {}: every option group needs a value and the price must be \
                 a number >= 0",
                path.display(),
                i + 1
            ));
        }
        products.push(p);
    }
    if products.is_empty() {
        return Err(format!("catalogue '{}' has no products", path.display()));
    }
    Ok(products)
}

/// The catalogue as JSON lines.
pub fn write(products: &[Product]) -> String {
    products
        .iter()
        .map(|p| serde_json::to_string(p).unwrap_or_default() + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_catalogue_is_the_generated_one() {
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/envs/webshop/catalogue.jsonl");
        let loaded = load(Path::new(shipped)).unwrap();
        assert_eq!(loaded, generate(0, DEFAULT_PRODUCTS));
        assert_eq!(
            std::fs::read_to_string(shipped).unwrap(),
            write(&loaded),
            "regenerate envs/webshop/catalogue.jsonl with catalogue::write(&generate(0, 300))"
        );
        // Every department and type appears; ids are unique.
        let types: std::collections::BTreeSet<&str> =
            loaded.iter().map(|p| p.product_type.as_str()).collect();
        assert_eq!(types.len(), 28, "{types:?}");
        let ids: std::collections::BTreeSet<&str> = loaded.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids.len(), DEFAULT_PRODUCTS);
    }

    #[test]
    fn a_bad_catalogue_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let mut text = write(&generate(1, 2));
        text.push_str("{\"id\": \"B9\"}\n");
        std::fs::write(&path, text).unwrap();
        let err = load(&path).unwrap_err();
        assert!(err.contains("line 3"), "{err}");
        std::fs::write(&path, "\n").unwrap();
        assert!(load(&path).unwrap_err().contains("no products"));
    }
}
