// A two-layer perceptron with a hand-written forward and backward, on
// synthetic data: what the example trainer, the DDP tests and the DDP
// benchmark train. Float32 on the host; no libraries beyond libcomm's Tensor.
//
//   h = relu(W1 x + b1),  y = W2 h + b2,  loss = mean over the batch of
//   |y - t|^2 / 2,
//
// where the target t comes from a fixed "teacher" network, so the loss can
// go to zero.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "libcomm/tensor.h"

namespace comm::examples {

// SplitMix64, so that data and initial weights are the same everywhere.
inline double uniform(std::uint64_t key) {
  std::uint64_t z = key + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

struct MlpShape {
  int inputs = 16;
  int hidden = 32;
  int outputs = 4;
};

class Mlp {
 public:
  // Parameters in registration order: W1, b1, W2, b2 (a backward produces
  // their gradients in reverse).
  Mlp(MlpShape shape, std::uint64_t seed) : shape_(shape) {
    const std::vector<Shape> shapes = {{shape.hidden, shape.inputs},
                                       {shape.hidden},
                                       {shape.outputs, shape.hidden},
                                       {shape.outputs}};
    const char* names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      names_.push_back(names[p]);
      params_.push_back(Tensor::empty(shapes[p], DType::kF32));
      grads_.push_back(Tensor::zeros(shapes[p], DType::kF32));
      momenta_.push_back(Tensor::zeros(shapes[p], DType::kF32));
      float* w = params_.back().data<float>();
      const double scale =
          1.0 / std::sqrt(static_cast<double>(shapes[p].back()));
      for (std::int64_t i = 0; i < params_.back().numel(); ++i)
        w[i] =
            static_cast<float>(scale * uniform(seed * 1000003 + p * 100003 +
                                               static_cast<std::uint64_t>(i)));
    }
  }

  const MlpShape& shape() const { return shape_; }
  std::vector<std::string>& names() { return names_; }
  std::vector<Tensor>& params() { return params_; }
  std::vector<Tensor>& grads() { return grads_; }
  std::vector<Tensor>& momenta() { return momenta_; }

  // Sample `index` of the synthetic dataset: its input and target.
  void sample(std::size_t index, std::vector<float>& x,
              std::vector<float>& t) const {
    x.resize(static_cast<std::size_t>(shape_.inputs));
    t.assign(static_cast<std::size_t>(shape_.outputs), 0.0f);
    for (int i = 0; i < shape_.inputs; ++i)
      x[static_cast<std::size_t>(i)] = static_cast<float>(
          uniform(index * 7919 + static_cast<std::uint64_t>(i)));
    // The teacher: a fixed smooth function of the input.
    for (int o = 0; o < shape_.outputs; ++o) {
      double acc = 0;
      for (int i = 0; i < shape_.inputs; ++i)
        acc +=
            std::sin(0.3 * (o + 1) * (i + 1)) * x[static_cast<std::size_t>(i)];
      t[static_cast<std::size_t>(o)] = static_cast<float>(std::tanh(acc));
    }
  }

  // Adds to the gradients (the caller zeroes them between steps) the
  // gradient of the batch's mean loss scaled by `weight` (1 for a plain
  // step; a micro-batch's share of a larger batch otherwise), and returns
  // the batch's mean loss. `on_ready(p)` is called as soon as parameter
  // p's gradient is final, in the order a backward produces them: fc2's
  // before fc1's.
  template <typename OnReady>
  double forward_backward(const std::vector<std::size_t>& batch, double weight,
                          OnReady on_ready) {
    const int I = shape_.inputs, H = shape_.hidden, O = shape_.outputs;
    const auto n = batch.size();
    std::vector<std::vector<float>> xs(n), hs(n), dys(n);
    double loss = 0;
    const float* w1 = params_[0].data<float>();
    const float* b1 = params_[1].data<float>();
    const float* w2 = params_[2].data<float>();
    const float* b2 = params_[3].data<float>();
    std::vector<float> t;
    for (std::size_t s = 0; s < n; ++s) {
      sample(batch[s], xs[s], t);
      hs[s].assign(static_cast<std::size_t>(H), 0.0f);
      for (int h = 0; h < H; ++h) {
        float acc = b1[h];
        for (int i = 0; i < I; ++i)
          acc += w1[h * I + i] * xs[s][static_cast<std::size_t>(i)];
        hs[s][static_cast<std::size_t>(h)] = acc > 0 ? acc : 0;
      }
      dys[s].assign(static_cast<std::size_t>(O), 0.0f);
      for (int o = 0; o < O; ++o) {
        float y = b2[o];
        for (int h = 0; h < H; ++h)
          y += w2[o * H + h] * hs[s][static_cast<std::size_t>(h)];
        const float diff = y - t[static_cast<std::size_t>(o)];
        loss += 0.5 * diff * diff;
        dys[s][static_cast<std::size_t>(o)] =
            static_cast<float>(diff * weight / static_cast<double>(n));
      }
    }
    // Backward: fc2 first.
    float* gw2 = grads_[2].data<float>();
    float* gb2 = grads_[3].data<float>();
    for (std::size_t s = 0; s < n; ++s) {
      for (int o = 0; o < O; ++o) {
        gb2[o] += dys[s][static_cast<std::size_t>(o)];
        for (int h = 0; h < H; ++h)
          gw2[o * H + h] += dys[s][static_cast<std::size_t>(o)] *
                            hs[s][static_cast<std::size_t>(h)];
      }
    }
    on_ready(3);
    on_ready(2);
    float* gw1 = grads_[0].data<float>();
    float* gb1 = grads_[1].data<float>();
    for (std::size_t s = 0; s < n; ++s) {
      for (int h = 0; h < H; ++h) {
        if (hs[s][static_cast<std::size_t>(h)] <= 0) continue;
        float dh = 0;
        for (int o = 0; o < O; ++o)
          dh += w2[o * H + h] * dys[s][static_cast<std::size_t>(o)];
        gb1[h] += dh;
        for (int i = 0; i < I; ++i)
          gw1[h * I + i] += dh * xs[s][static_cast<std::size_t>(i)];
      }
    }
    on_ready(1);
    on_ready(0);
    return loss / static_cast<double>(n);
  }

  void zero_grads() {
    for (Tensor& g : grads_) {
      float* d = g.data<float>();
      for (std::int64_t i = 0; i < g.numel(); ++i) d[i] = 0;
    }
  }

  // SGD with momentum: v = momentum * v + g; w -= lr * v.
  void sgd_step(double lr, double momentum) {
    for (std::size_t p = 0; p < params_.size(); ++p) {
      float* w = params_[p].data<float>();
      float* v = momenta_[p].data<float>();
      const float* g = grads_[p].data<float>();
      for (std::int64_t i = 0; i < params_[p].numel(); ++i) {
        v[i] = static_cast<float>(momentum) * v[i] + g[i];
        w[i] -= static_cast<float>(lr) * v[i];
      }
    }
  }

 private:
  MlpShape shape_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_, grads_, momenta_;
};

}  // namespace comm::examples
