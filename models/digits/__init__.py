"""digits: an MLP on scikit-learn's 8x8 handwritten digits (1,797 real images,
shipped inside scikit-learn): the fastest end-to-end demo of the Trainer."""
