//! The verifier on the answer styles of the issue, each decided by hand.

use super::*;

fn same(answer: &str, truth: &str) -> bool {
    answers_match(answer, truth, Options::default())
}

#[test]
fn numbers_in_every_notation() {
    for (a, t) in [
        ("1,000", "1000"),
        ("1\\,000", "1000"),
        ("1{,}000", "1000"),
        ("12,345.5", "12345.5"),
        ("−3", "-3"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "0.75"),
        ("\\tfrac12", "1/2"),
        ("2\\frac{1}{2}", "\\frac52"),
        ("2\\frac12", "2.5"),
        ("1.5e-3", "0.0015"),
        ("3.2 \\times 10^5", "320000"),
        ("3.2 \\cdot 10^{5}", "320000"),
        ("30^\\circ", "30"),
        ("30^{\\circ}", "30"),
        ("5\\text{ cm}", "5"),
        ("5 cm^2", "5"),
        ("\\$1,500", "1500"),
        ("12 apples", "12"),
        ("\\sqrt{12}", "2\\sqrt{3}"),
        ("\\sqrt[3]{-8}", "-2"),
        ("2\\pi", "\\pi + \\pi"),
        ("5!", "120"),
        ("\\binom{5}{2}", "10"),
        ("\\left( 3 \\right)", "3"),
        ("\\log_2 8", "3"),
    ] {
        assert!(same(a, t), "{a} should equal {t}");
    }
    for (a, t) in [
        ("0.33", "\\frac13"),
        ("3.14159", "\\pi"),
        ("1,00", "100"),
        ("2\\frac{1}{2}", "1"),
        ("-3", "3"),
        ("1e3", "100"),
    ] {
        assert!(!same(a, t), "{a} should differ from {t}");
    }
}

#[test]
fn percentages_follow_the_option() {
    assert!(same("50\\%", "50"));
    assert!(same("50\\%", "0.5"));
    assert!(same("0.5", "50%"));
    let strict = Options {
        percent_is_fraction: false,
    };
    assert!(answers_match("50\\%", "50", strict));
    assert!(!answers_match("50\\%", "0.5", strict));
    assert!(!answers_match("0.5", "50%", strict));
}

#[test]
fn expressions_compare_symbolically() {
    for (a, t) in [
        ("x^2+2x+1", "(x+1)^2"),
        ("(x+1)(x-1)", "x^2 - 1"),
        ("\\frac{x}{2}", "0.5x"),
        ("\\sin^2 x + \\cos^2 x", "1"),
        ("2^{n+1}", "2 \\cdot 2^n"),
        ("a_1 + a_2", "a_2 + a_1"),
    ] {
        assert!(same(a, t), "{a} should equal {t}");
    }
    assert!(!same("x^2+2x", "(x+1)^2"));
    assert!(!same("x", "y"));
    assert!(!same("(B)", "A"));
    assert!(same("(B)", "B"));
}

#[test]
fn tuples_intervals_sets_and_lists() {
    assert!(same("(1, 2)", "(1,2)"));
    assert!(!same("(2, 1)", "(1,2)"));
    assert!(same("[0, 1)", "[0,1)"));
    assert!(!same("[0, 1]", "[0,1)"));
    assert!(!same("(0, 1]", "[0,1]"));
    assert!(same("(-\\infty, 3]", "(-\\infty,3]"));
    assert!(!same("(-\\infty, 3]", "(\\infty,3]"));
    assert!(same(
        "(-\\infty, 1) \\cup (2, \\infty)",
        "(2,\\infty)\\cup(-\\infty,1)"
    ));
    assert!(same("\\{3, 2, 1\\}", "\\{1,2,3\\}"));
    assert!(!same("\\{3, 2\\}", "\\{1,2,3\\}"));
    assert!(same("2 and 7", "2, 7"));
    assert!(same("7, 2", "2, 7"));
    assert!(same("x = 2 \\text{ or } x = 7", "2, 7"));
    assert!(same("\\pm 3", "3, -3"));
    assert!(same("x = 1 \\pm \\sqrt{2}", "1+\\sqrt2, 1-\\sqrt2"));
    assert!(same("\\{2, 7\\}", "2, 7"));
    assert!(!same("2", "2, 7"));
    assert!(same("(3, 4)", "3, 4"));
}

#[test]
fn equations_and_text() {
    assert!(same("x = 5", "5"));
    assert!(same("5", "x=5"));
    assert!(same("y = 2x + 1", "y=1+2x"));
    assert!(same("x^2 + y^2 = 1", "y^2 + x^2 = 1"));
    assert!(same("x = 3 + 2 = 5", "5"));
    assert!(!same("x = 6", "5"));
    assert!(same("\\text{Monday}", "monday"));
    assert!(!same("\\text{Tuesday}", "Monday"));
    assert!(same("x > 3", "x>3"));
    assert!(!same("", ""));
}

#[test]
fn scores_whole_responses() {
    let o = Options::default();
    let out = score("The answer is 118. Then we add 5 to get 123.", "118", o);
    assert!(out.correct);
    assert_eq!(out.extracted.as_deref(), Some("118"));
    assert!(score("Thus $\\boxed{2\\sqrt{3}}$.", "$\\sqrt{12}$", o).correct);
    assert!(score("So the answer is $\\frac{1}{2}$.", "#### 0.5", o).correct);
    let cut = score("\\boxed{4}. Hmm, actually \\boxed{\\frac{9}{", "4", o);
    assert!(!cut.format_ok && !cut.correct && cut.score == 0.0);
    assert!(!score("no number", "4", o).format_ok);
}

#[test]
fn pathological_inputs_end_quickly_with_an_outcome() {
    let deep = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(!same(&deep, "1"), "nesting beyond the limit is text, not 1");
    let braces = format!("\\boxed{{{}", "{".repeat(100_000));
    assert!(!score(&braces, "1", Options::default()).format_ok);
    let long_sum = vec!["1"; 900].join("+");
    assert!(same(&long_sum, "900"));
    let flood = "9".repeat(100_000);
    assert!(!same(&flood, "1"));
    let minus = format!("{}1", "-".repeat(5_000));
    assert!(!same(&minus, "1"));
    for junk in [
        "\\", "\\frac", "\\sqrt[", "^^^", "((", "\\{", "|", "$$", "\\left.",
    ] {
        let _ = score(junk, junk, Options::default());
        let _ = same(junk, "1");
    }
}

#[test]
fn repeating_decimals_choices_and_values_of_expressions() {
    assert!(same("0.1\\overline{6}", "\\frac16"));
    assert!(same("0.\\overline{3}", "1/3"));
    assert!(same("0.\\overline{142857}", "\\frac17"));
    assert!(!same("0.1\\overline{6}", "0.16"));
    assert!(same("C", "\\text{(C)}"));
    assert!(!same("B", "\\text{(C)}"));
    assert!(same("m + n = 19", "19"));
    assert!(!same("m + n = 19", "20"));
    // A relation between two expressions with variables gives no single value.
    assert!(!same("x^2 = y", "y"));
}

#[test]
fn angles_inequalities_set_builders_and_words() {
    assert!(same("60^\\circ", "\\frac{\\pi}{3}"));
    assert!(same("\\frac{\\pi}{4}", "45^\\circ"));
    assert!(same("45°", "45"));
    assert!(!same("60^\\circ", "\\frac{\\pi}{4}"));
    assert!(same("\\sin 30^\\circ", "\\frac12"));
    assert!(same("x \\leq 2", "(-\\infty, 2]"));
    assert!(!same("x < 2", "(-\\infty, 2]"));
    assert!(same("x > 1", "(1, \\infty)"));
    assert!(same("2 \\ge x", "(-\\infty, 2]"));
    assert!(same("1 < a < 2", "(1, 2)"));
    assert!(same("1 \\le a < 2", "[1, 2)"));
    assert!(!same("1 \\le a < 2", "(1, 2)"));
    assert!(same("3 > a > 1", "(1, 3)"));
    assert!(same("\\{x \\mid x > 1\\}", "(1, +\\infty)"));
    assert!(same("x \\le 2", "x<=2"));
    assert!(same("1 million", "1000000"));
    assert!(same("1 1/2", "1.5"));
    assert!(same("9 \\times 100 = 900", "900"));
    assert!(!same("9 \\times 100 = 900", "9"));
    assert!(same("\\frac{(2n)!}{(n!)^2}", "\\binom{2n}{n}"));
    assert!(!same("\\frac{(2n)!}{n!}", "\\binom{2n}{n}"));
}

#[test]
fn random_latex_soup_never_panics() {
    // 20,000 strings of LaTeX-ish pieces, from a fixed seed: every one gets an outcome.
    const PIECES: [&str; 40] = [
        "\\frac", "\\sqrt", "{", "}", "(", ")", "[", "]", "\\{", "\\}", "1", "23", "0.5", "x",
        "y_", "^", "_", "-", "+", "=", "<", "\\le", ",", "and", "\\pm", "\\cup", "|", "!", "\\%",
        "°", "\\circ", "\\text{", "cm", "\\boxed{", "$", "\\infty", "\\pi", "e", "\\binom", " ",
    ];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let len = (next() % 24) as usize;
        let s: String = (0..len).map(|_| PIECES[(next() % 40) as usize]).collect();
        let _ = score(&s, "1", Options::default());
        let _ = answers_match(&s, &s, Options::default());
    }
}
