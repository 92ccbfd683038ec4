// The data set both examples train on: least-squares regression y = X w* + 0.5 + noise, with
// deterministic random features, and its full-data loss.
export function regressionData({ features, samples }) {
  let seed = 42;
  const random = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 4294967296) * 2 - 1;
  const trueWeights = Float32Array.from({ length: features }, random);
  const X = Float32Array.from({ length: samples * features }, random);
  const Y = new Float32Array(samples);
  for (let s = 0; s < samples; s++) {
    let y = 0.5; // true bias
    for (let f = 0; f < features; f++) y += X[s * features + f] * trueWeights[f];
    Y[s] = y + 0.01 * random();
  }
  // Adds sample s's gradient of the squared error at weights w, bias b to wGrad, bGrad.
  const addGradient = (s, w, b, wGrad, bGrad) => {
    let e = b[0] - Y[s];
    for (let f = 0; f < features; f++) e += X[s * features + f] * w[f];
    for (let f = 0; f < features; f++) wGrad[f] += 2 * e * X[s * features + f];
    bGrad[0] += 2 * e;
  };
  const loss = (w, b) => {
    let total = 0;
    for (let s = 0; s < samples; s++) {
      let e = b[0] - Y[s];
      for (let f = 0; f < features; f++) e += X[s * features + f] * w[f];
      total += e * e;
    }
    return total / samples;
  };
  return { addGradient, loss };
}
