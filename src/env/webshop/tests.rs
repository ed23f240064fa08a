use std::collections::BTreeMap;

use super::*;

fn shop() -> WebShop {
    WebShop::from_params(&[]).unwrap()
}

fn step(env: &mut WebShop, action: &str) -> Step {
    env.step(action).unwrap_or_else(|e| panic!("{action}: {e}"))
}

#[test]
fn buying_the_target_with_its_options_scores_one() {
    let mut env = shop();
    for seed in 0..20 {
        env.reset(seed).unwrap();
        let goal = env.goal.clone();
        assert!(
            goal.instruction.starts_with("i am looking for a "),
            "{}",
            goal.instruction
        );
        step(
            &mut env,
            &format!(
                "search[{} {}]",
                goal.product_type,
                goal.attributes.join(" ")
            ),
        );
        // Page through the results to the target.
        let id = goal.target_id.to_lowercase();
        while !env.clickables().contains(&id) {
            assert!(
                env.clickables().contains(&"next >".to_string()),
                "seed {seed}: not found"
            );
            step(&mut env, "click[next >]");
        }
        step(&mut env, &format!("click[{id}]"));
        assert_eq!(env.info()["page"], "item");
        for value in goal.options.values() {
            step(&mut env, &format!("click[{value}]"));
        }
        let s = step(&mut env, "click[Buy Now]");
        assert_eq!(
            (s.reward, s.done),
            (1.0, true),
            "seed {seed}: {}",
            s.observation
        );
        assert_eq!(s.info["success"], true);
        // A finished episode absorbs every action.
        assert_eq!(step(&mut env, "click[buy now]").reward, 0.0);
    }
}

fn product(id: &str, title: &str, ty: &str, cat: [&str; 3], attrs: &[&str], price: f64) -> Product {
    Product {
        id: id.into(),
        title: title.into(),
        product_type: ty.into(),
        category: cat.iter().map(|c| c.to_string()).collect(),
        attributes: attrs.iter().map(|a| a.to_string()).collect(),
        options: BTreeMap::from([
            (
                "color".to_string(),
                vec!["black".to_string(), "navy".to_string()],
            ),
            (
                "size".to_string(),
                vec!["small".to_string(), "large".to_string()],
            ),
        ]),
        price,
    }
}

#[test]
fn the_score_follows_webshops_formula() {
    let shirt = ["clothing", "tops", "t-shirt"];
    let target = product(
        "B1",
        "acme cotton t-shirt",
        "t-shirt",
        shirt,
        &["cotton", "slim fit"],
        20.0,
    );
    let goal = Goal::new(
        &target,
        vec!["cotton".into(), "slim fit".into()],
        BTreeMap::from([
            ("color".into(), "navy".into()),
            ("size".into(), "large".into()),
        ]),
        30.0,
    );
    assert_eq!(
        goal.instruction,
        "i am looking for a t-shirt that is cotton and slim fit, with color: navy, and size: \
         large, and price lower than 30.00 dollars"
    );
    let pick =
        |c: &str, s: &str| BTreeMap::from([("color".into(), c.into()), ("size".into(), s.into())]);
    // Everything: (2 + 2 + 1) / 5.
    assert_eq!(score(&goal, &target, &pick("navy", "large")), 1.0);
    // Same type, one attribute, one option, within the price: (1 + 1 + 1) / 5 = 0.6.
    let other = product(
        "B2",
        "acme stretch t-shirt",
        "t-shirt",
        shirt,
        &["cotton", "stretch"],
        25.0,
    );
    assert!((score(&goal, &other, &pick("navy", "small")) - 0.6).abs() < 1e-12);
    // Too expensive, nothing selected: (1 + 0 + 0) / 5 = 0.2.
    let dear = product(
        "B3",
        "acme stretch t-shirt",
        "t-shirt",
        shirt,
        &["cotton"],
        31.0,
    );
    assert!((score(&goal, &dear, &BTreeMap::new()) - 0.2).abs() < 1e-12);
    // Another type of the same brand and department: nouns {acme, t-shirt} vs {acme, hoodie},
    // title score 0.5 > 0.2, r_type 1: (2 + 2 + 1) / 5.
    let hoodie = product(
        "B4",
        "acme cotton slim fit hoodie",
        "hoodie",
        ["clothing", "tops", "hoodie"],
        &["cotton", "slim fit"],
        20.0,
    );
    assert_eq!(score(&goal, &hoodie, &pick("navy", "large")), 1.0);
    // A title holding a goal value inside a word does not meet it: the goal wants navy; the
    // brand "evernavy" holds it, the selected colour is black: (2 + 1 + 1) / 5 = 0.8. Choosing
    // options the goal does not ask for never adds to the score.
    let brand = product(
        "B6",
        "evernavy cotton slim fit t-shirt",
        "t-shirt",
        shirt,
        &["cotton", "slim fit"],
        20.0,
    );
    assert!((score(&goal, &brand, &pick("black", "large")) - 0.8).abs() < 1e-12);
    let mut extra = pick("black", "large");
    extra.insert("pack".into(), "navy".into());
    assert_eq!(
        score(&goal, &brand, &extra),
        1.0,
        "a selected navy meets the goal's navy"
    );
    let mut many = pick("navy", "large");
    many.insert("pack".into(), "large".into());
    assert_eq!(score(&goal, &target, &many), 1.0, "never above 1");
    // Another brand and type: title score 0, r_type 0.
    let mug = product(
        "B5",
        "lumen cotton mug",
        "mug",
        ["home", "kitchen", "mug"],
        &["cotton"],
        5.0,
    );
    assert_eq!(score(&goal, &mug, &pick("navy", "large")), 0.0);
}

#[test]
fn what_is_not_on_the_page_is_invalid_and_changes_nothing() {
    let mut env = shop();
    env.reset(3).unwrap();
    let before = env.state_hash();
    for bad in ["click[buy now]", "buy it", "jump[x]", "search[]"] {
        assert!(matches!(env.step(bad), Err(StepError::Invalid(_))), "{bad}");
        assert_eq!(env.state_hash(), before, "{bad}");
    }
    step(&mut env, "search[t-shirt]");
    assert!(matches!(
        env.step("search[mug]"),
        Err(StepError::Invalid(_))
    ));
    assert!(matches!(
        env.step("click[b9999]"),
        Err(StepError::Invalid(_))
    ));
    assert_eq!(
        step(&mut env, "click[Back to Search]").info["page"],
        "search"
    );
    // The same seed gives the same instruction; another seed another one.
    let first = env.reset(3).unwrap();
    assert_eq!(env.reset(3).unwrap(), first);
    assert_ne!(env.reset(4).unwrap(), first);
}

#[test]
fn the_step_limit_ends_an_episode_without_a_reward() {
    let mut env = WebShop::from_params(&[("max_steps".into(), "3".into())]).unwrap();
    env.reset(0).unwrap();
    step(&mut env, "search[coffee]");
    step(&mut env, "click[back to search]");
    let s = step(&mut env, "search[tea]");
    assert_eq!(
        (s.reward, s.done, s.info["success"].clone()),
        (0.0, true, Value::Bool(false))
    );
    let err = |p: &[(&str, &str)]| {
        let p: Vec<(String, String)> = p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        WebShop::from_params(&p).err().unwrap_or_default()
    };
    assert!(err(&[("max_step", "3")]).contains("did you mean 'max_steps'"));
    assert!(err(&[("max_steps", "0")]).contains(">= 1"));
    assert!(err(&[("catalogue", "/no/such.jsonl")]).contains("/no/such.jsonl"));
}

#[test]
fn products_keeps_the_first_n_of_the_catalogue() {
    let small = WebShop::from_params(&[("products".into(), "40".into())]).unwrap();
    // The generated catalogue draws product after product from one stream, so the small shop
    // is the default one's first 40 (the same products, not another draw).
    assert_eq!(small.products.as_slice(), &shop().products[..40]);
    // A file is cut the same way.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    std::fs::write(&path, catalogue::write(&catalogue::generate(5, 12))).unwrap();
    let cut = WebShop::from_params(&[
        ("catalogue".into(), path.display().to_string()),
        ("products".into(), "3".into()),
    ])
    .unwrap();
    assert_eq!(cut.products.as_slice(), &catalogue::generate(5, 3)[..]);
    let over = WebShop::from_params(&[
        ("catalogue".into(), path.display().to_string()),
        ("products".into(), "13".into()),
    ])
    .err()
    .unwrap_or_default();
    assert_eq!(over, "products 13: the catalogue has only 12 products");
    // Every goal is drawn from the products kept.
    let mut env = small;
    for seed in 0..30 {
        env.reset(seed).unwrap();
        let target: usize = env.goal.target_id[1..].parse().unwrap();
        assert!((1..=40).contains(&target), "{}", env.goal.target_id);
    }
    let err = WebShop::from_params(&[("products".into(), "0".into())])
        .err()
        .unwrap_or_default();
    assert!(
        err.contains("products '0' must be a whole number >= 1"),
        "{err}"
    );
}
