//! The few random distributions the generator and decoration need, built on uniform draws
//! (`rand_distr` is not a dependency). Every sampler takes the caller's generator, so a seed fixes
//! the whole stream.

use rand::Rng;

/// A draw from the standard normal distribution (Box–Muller; the pair's second value is dropped,
/// which costs one extra uniform draw and keeps the sampler stateless).
pub(super) fn standard_normal(rng: &mut impl Rng) -> f64 {
    // `1 - u` lies in (0, 1], so the logarithm is finite.
    let radius = (-2.0 * (1.0 - rng.random::<f64>()).ln()).sqrt();
    radius * (std::f64::consts::TAU * rng.random::<f64>()).cos()
}

/// A log-normal draw given its median and the sigma of the underlying normal.
pub(super) fn log_normal(rng: &mut impl Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * standard_normal(rng)).exp()
}

/// An exponential draw with the given mean.
pub(super) fn exponential(rng: &mut impl Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.random::<f64>()).ln()
}

/// Whether an event of probability `p` happens.
pub(super) fn chance(rng: &mut impl Rng, p: f64) -> bool {
    rng.random::<f64>() < p
}

/// An index drawn with probability proportional to `weights`; `None` when no weight is positive.
/// Negative and NaN weights count as zero.
pub(super) fn weighted_index(rng: &mut impl Rng, weights: &[f64]) -> Option<usize> {
    let usable = |w: f64| if w > 0.0 { w } else { 0.0 };
    let total: f64 = weights.iter().map(|&w| usable(w)).sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let mut pick = rng.random::<f64>() * total;
    let mut last_positive = None;
    for (index, &weight) in weights.iter().enumerate() {
        let weight = usable(weight);
        if weight > 0.0 {
            if pick < weight {
                return Some(index);
            }
            pick -= weight;
            last_positive = Some(index);
        }
    }
    // Rounding can leave `pick` a hair above the last weight.
    last_positive
}

/// A value drawn from a quantile function given as knots `(probability, value)`: probabilities
/// ascending from 0 to 1, values positive and ascending. Between knots the logarithm of the value
/// is interpolated linearly, which suits heavy-tailed quantities such as run times: the published
/// percentiles are reproduced exactly and each segment is log-uniform.
pub(super) fn from_quantiles(rng: &mut impl Rng, knots: &[(f64, f64)]) -> f64 {
    let u: f64 = rng.random();
    let mut previous: Option<(f64, f64)> = None;
    for &(probability, value) in knots {
        if let Some((low_p, low_value)) = previous
            && u <= probability
        {
            let span = probability - low_p;
            let fraction = if span > 0.0 { (u - low_p) / span } else { 0.0 };
            return (low_value.ln() + fraction * (value.ln() - low_value.ln())).exp();
        }
        previous = Some((probability, value));
    }
    previous.map_or(0.0, |(_, value)| value)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn normal_draws_have_zero_mean_and_unit_variance() {
        let mut rng = StdRng::seed_from_u64(1);
        let draws: Vec<f64> = (0..100_000).map(|_| standard_normal(&mut rng)).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        let variance = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / draws.len() as f64;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((variance - 1.0).abs() < 0.02, "{variance}");
    }

    #[test]
    fn weighted_index_follows_the_weights_and_skips_zero_weights() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[weighted_index(&mut rng, &[1.0, 0.0, 2.0]).unwrap()] += 1;
        }
        assert_eq!(counts[1], 0);
        let share = f64::from(counts[2]) / 30_000.0;
        assert!((share - 2.0 / 3.0).abs() < 0.02, "{share}");
        assert_eq!(weighted_index(&mut rng, &[]), None);
        assert_eq!(weighted_index(&mut rng, &[0.0, -1.0, f64::NAN]), None);
    }

    #[test]
    fn quantile_sampler_reproduces_its_knots() {
        let knots = [(0.0, 1.0), (0.5, 100.0), (0.9, 1_000.0), (1.0, 10_000.0)];
        let mut rng = StdRng::seed_from_u64(3);
        let mut draws: Vec<f64> = (0..50_000).map(|_| from_quantiles(&mut rng, &knots)).collect();
        draws.sort_by(f64::total_cmp);
        let median = draws[draws.len() / 2];
        let p90 = draws[draws.len() * 9 / 10];
        assert!((median / 100.0 - 1.0).abs() < 0.1, "{median}");
        assert!((p90 / 1_000.0 - 1.0).abs() < 0.1, "{p90}");
        assert!(draws.iter().all(|&d| (1.0..=10_000.0).contains(&d)));
    }
}
